//! Keys and values as a person or a script gives and reads them: text, or hex (two digits a
//! byte) for any bytes at all. Nothing is ever replaced on the way: bytes that a form cannot
//! carry are refused, or carried in hex.

use crate::error::CliError;
use crate::json::json_str;

/// How keys and values are written on the command line, in `load`'s input and in output.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// UTF-8 text.
    Text,
    /// Two hex digits a byte.
    Hex,
}

impl Form {
    pub fn of(hex: bool) -> Form {
        if hex {
            Form::Hex
        } else {
            Form::Text
        }
    }

    /// The bytes an argument (or a field of `load`'s input) stands for.
    pub fn parse(self, s: &str, what: &str) -> Result<Vec<u8>, String> {
        match self {
            Form::Text => Ok(s.as_bytes().to_vec()),
            Form::Hex => from_hex(s).ok_or_else(|| format!("{what} {s:?} is not hex (two digits a byte)")),
        }
    }

    /// `b` as a field of a tab-separated line: hex, or the text itself when it is UTF-8 with
    /// no tab, newline or carriage return (which would change what the line says).
    pub fn field(self, b: &[u8]) -> Option<String> {
        match self {
            Form::Hex => Some(to_hex(b)),
            Form::Text => {
                std::str::from_utf8(b).ok().filter(|s| !s.contains(['\t', '\n', '\r'])).map(str::to_string)
            }
        }
    }

    /// `"name": "text"` when `b` is UTF-8 and the form is text, else `"name_hex": "…"`.
    pub fn json(self, name: &str, b: &[u8]) -> String {
        match std::str::from_utf8(b).ok().filter(|_| self == Form::Text) {
            Some(s) => format!("\"{name}\": {}", json_str(s)),
            None => format!("\"{name}_hex\": \"{}\"", to_hex(b)),
        }
    }

    /// A tab-separated line `KEY<TAB>VALUE`, or the error that names the entry a line in
    /// this form cannot carry.
    pub fn line(self, k: &[u8], v: &[u8]) -> Result<String, CliError> {
        match (self.field(k), self.field(v)) {
            (Some(k), Some(v)) => Ok(format!("{k}\t{v}")),
            _ => Err(CliError::Usage(format!(
                "the entry with key {} holds bytes a text line cannot carry (not UTF-8, or a tab or newline): \
                 read it with --hex or --json, or the whole store with `bitmend kv dump`",
                self.shown(k)
            ))),
        }
    }

    /// A key for a message: quoted text when it is UTF-8, else hex.
    pub fn shown(self, k: &[u8]) -> String {
        match std::str::from_utf8(k).ok().filter(|_| self == Form::Text) {
            Some(s) => format!("{s:?}"),
            None => format!("0x{}", to_hex(k)),
        }
    }
}

pub fn to_hex(b: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(2 * b.len());
    for &x in b {
        s.push(DIGITS[(x >> 4) as usize] as char);
        s.push(DIGITS[(x & 15) as usize] as char);
    }
    s
}

pub fn from_hex(s: &str) -> Option<Vec<u8>> {
    let s = s.as_bytes();
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    s.chunks(2).map(|p| Some(digit(p[0])? << 4 | digit(p[1])?)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_every_byte_and_refuses_what_is_not_hex() {
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(from_hex(&to_hex(&all)).unwrap(), all);
        assert_eq!(to_hex(b"\x00\xff\t"), "00ff09");
        assert_eq!(from_hex("0A0b").unwrap(), vec![10, 11]);
        for bad in ["a", "0g", "zz", " 0a"] {
            assert_eq!(from_hex(bad), None, "{bad:?}");
        }
        assert_eq!(from_hex("").unwrap(), Vec::<u8>::new());
    }

    #[test]
    fn text_forms_never_replace_bytes() {
        assert_eq!(Form::Text.field(b"plain"), Some("plain".into()));
        assert_eq!(Form::Text.field(b"a\tb"), None);
        assert_eq!(Form::Text.field(b"\xff"), None);
        assert_eq!(Form::Text.json("value", b"\xff\x00"), "\"value_hex\": \"ff00\"");
        assert_eq!(Form::Text.json("key", b"k\n"), "\"key\": \"k\\u000a\"");
        assert_eq!(Form::Hex.json("key", b"k"), "\"key_hex\": \"6b\"");
        assert!(Form::Text.line(b"k", b"\xfe").is_err());
        assert_eq!(Form::Hex.line(b"k", b"\xfe").unwrap(), "6b\tfe");
    }
}
