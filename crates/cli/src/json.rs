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

#[cfg(test)]
mod tests {
    #[test]
    fn quotes_backslashes_and_control_characters_are_escaped() {
        assert_eq!(super::json_str("a\"b\\c\nd"), r#""a\"b\\c\u000ad""#);
    }
}
