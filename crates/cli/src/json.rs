//! JSON strings for `--json` output (the rest of each object is written field by field).

/// `s` as a JSON string literal, quotes included.
pub fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => o.push_str(&format!("\\u{:04x}", c as u32)),
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

// What the control file's JSON is read back with: its fields are flat and known.

/// The number after `"key": ` in a line of the control file's JSON.
pub fn field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    let at = status.find(&format!("\"{key}\": "))? + key.len() + 4;
    let rest = &status[at..];
    Some(rest[..rest.find([',', '}'])?].trim_matches('"'))
}

/// The string after `"key": ` (JSON-quoted, as Rust's `{:?}` writes it), `None` for null.
pub fn text_field(status: &str, key: &str) -> Option<String> {
    let at = status.find(&format!("\"{key}\": \""))? + key.len() + 5;
    let mut out = String::new();
    let mut chars = status[at..].chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return Some(out),
            '\\' => out.push(chars.next()?),
            c => out.push(c),
        }
    }
    None
}

pub fn number(status: &str, key: &str) -> Result<u64, String> {
    field(status, key)
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("control file: no {key} in {status:?}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn quotes_backslashes_and_control_characters_are_escaped() {
        assert_eq!(super::json_str("a\"b\\c\nd"), r#""a\"b\\c\u000ad""#);
    }

    #[test]
    fn fields_read_back_what_was_written() {
        let line = format!(
            "{{\"state\": \"idle\", \"n\": 42, \"error\": {}, \"x\": null}}",
            super::json_str("a \"b\"")
        );
        assert_eq!(super::field(&line, "state"), Some("idle"));
        assert_eq!(super::number(&line, "n"), Ok(42));
        assert_eq!(super::text_field(&line, "error").as_deref(), Some("a \"b\""));
        assert_eq!(super::text_field(&line, "x"), None);
        assert!(super::number(&line, "missing").is_err());
    }
}
