//! Little-endian fields, the one way every on-media format of bitmend reads and writes them
//! (docs/FORMAT.md: "all integers are little-endian").
//!
//! Two shapes of format, two tools:
//! - fixed layouts (a spare area, a superblock, a fragment header) name their offsets as
//!   constants mirroring FORMAT.md's tables, and read and write them with [`get_u32`],
//!   [`put_u32`] and their kin;
//! - variable records (a checkpoint, a map node, an xattr set) are written with [`Put`] on a
//!   `Vec<u8>` and read back with a [`Reader`], which returns `None` instead of reading past
//!   the end: a short or hostile record is an error, never a panic.

macro_rules! fixed {
    ($get:ident, $put:ident, $t:ty, $n:literal) => {
        #[doc = concat!("The `", stringify!($t), "` at byte `at` of `b`. Panics past the end: a fixed layout's")]
        #[doc = "caller checks the length once, before its fields."]
        #[inline]
        pub fn $get(b: &[u8], at: usize) -> $t {
            <$t>::from_le_bytes(b[at..at + $n].try_into().expect("a fixed-size field"))
        }

        #[doc = concat!("Writes `v` as a little-endian `", stringify!($t), "` at byte `at` of `b`.")]
        #[inline]
        pub fn $put(b: &mut [u8], at: usize, v: $t) {
            b[at..at + $n].copy_from_slice(&v.to_le_bytes());
        }
    };
}

fixed!(get_u16, put_u16, u16, 2);
fixed!(get_u32, put_u32, u32, 4);
fixed!(get_u64, put_u64, u64, 8);
fixed!(get_i64, put_i64, i64, 8);

/// Appends little-endian fields to a record being written.
pub trait Put {
    fn put_u8(&mut self, v: u8);
    fn put_u16(&mut self, v: u16);
    fn put_u32(&mut self, v: u32);
    fn put_u64(&mut self, v: u64);
    fn put_i64(&mut self, v: i64);
    fn put_bytes(&mut self, b: &[u8]);
}

impl Put for Vec<u8> {
    fn put_u8(&mut self, v: u8) {
        self.push(v);
    }
    fn put_u16(&mut self, v: u16) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u32(&mut self, v: u32) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_u64(&mut self, v: u64) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_i64(&mut self, v: i64) {
        self.extend_from_slice(&v.to_le_bytes());
    }
    fn put_bytes(&mut self, b: &[u8]) {
        self.extend_from_slice(b);
    }
}

/// Reads a record front to back; every read is `None` once too few bytes are left.
#[derive(Clone, Copy, Debug)]
pub struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    pub fn new(b: &'a [u8]) -> Reader<'a> {
        Reader { rest: b }
    }

    /// The next `n` bytes.
    pub fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.rest.len() < n {
            return None;
        }
        let (a, b) = self.rest.split_at(n);
        self.rest = b;
        Some(a)
    }

    pub fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Option<u16> {
        Some(get_u16(self.take(2)?, 0))
    }
    pub fn u32(&mut self) -> Option<u32> {
        Some(get_u32(self.take(4)?, 0))
    }
    pub fn u64(&mut self) -> Option<u64> {
        Some(get_u64(self.take(8)?, 0))
    }
    pub fn i64(&mut self) -> Option<i64> {
        Some(get_i64(self.take(8)?, 0))
    }

    /// What is left unread.
    pub fn rest(&self) -> &'a [u8] {
        self.rest
    }

    pub fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }
}

/// An enum stored as one byte: its values and their bytes written once, with `from_u8` (the
/// one decoder of that byte) derived from the same list. `as u8` encodes.
#[macro_export]
macro_rules! byte_enum {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $byte:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[repr(u8)]
        $vis enum $name {
            $( $(#[$vmeta])* $variant = $byte, )+
        }

        impl $name {
            /// The value a byte on the medium stands for; `None` for a byte none does.
            pub fn from_u8(b: u8) -> Option<$name> {
                match b {
                    $( $byte => Some($name::$variant), )+
                    _ => None,
                }
            }
        }
    };
}

/// Whether every byte of `b` is zero: an unwritten area of a format (a log chunk's tail, a
/// never-used header). Blocks of 256 bytes are OR-ed whole, which compiles to vector code;
/// a byte-at-a-time scan with an early exit does not, and was a fifth of a journal append.
pub fn is_zero(b: &[u8]) -> bool {
    let mut blocks = b.chunks_exact(256);
    for block in &mut blocks {
        if block.iter().fold(0u8, |acc, &x| acc | x) != 0 {
            return false;
        }
    }
    blocks.remainder().iter().all(|&x| x == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_fields_sit_where_they_are_put() {
        let mut b = [0u8; 24];
        put_u16(&mut b, 1, 0xBEEF);
        put_u32(&mut b, 3, 0x0102_0304);
        put_u64(&mut b, 8, 0x1122_3344_5566_7788);
        put_i64(&mut b, 16, -2);
        assert_eq!(&b[1..3], &[0xEF, 0xBE]);
        assert_eq!(&b[3..7], &[4, 3, 2, 1]);
        assert_eq!((get_u16(&b, 1), get_u32(&b, 3)), (0xBEEF, 0x0102_0304));
        assert_eq!((get_u64(&b, 8), get_i64(&b, 16)), (0x1122_3344_5566_7788, -2));
    }

    #[test]
    fn a_record_reads_back_and_a_short_one_is_none() {
        let mut v = Vec::new();
        v.put_u8(7);
        v.put_u16(300);
        v.put_u32(70_000);
        v.put_u64(u64::MAX - 1);
        v.put_i64(-5);
        v.put_bytes(b"name");
        let mut r = Reader::new(&v);
        assert_eq!((r.u8(), r.u16(), r.u32()), (Some(7), Some(300), Some(70_000)));
        assert_eq!((r.u64(), r.i64()), (Some(u64::MAX - 1), Some(-5)));
        assert_eq!(r.take(4), Some(&b"name"[..]));
        assert!(r.is_empty());
        assert_eq!(r.u8(), None);
        // A u32 with only three bytes left: None, and nothing consumed.
        let mut short = Reader::new(&[1, 2, 3]);
        assert_eq!(short.u32(), None);
        assert_eq!(short.rest(), &[1, 2, 3]);
    }

    crate::byte_enum! {
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        enum Shade {
            Light = 1,
            Dark = 7,
        }
    }

    #[test]
    fn a_byte_enum_decodes_what_it_encodes_and_nothing_else() {
        for s in [Shade::Light, Shade::Dark] {
            assert_eq!(Shade::from_u8(s as u8), Some(s));
        }
        let known = (0..=255u8).filter(|&b| Shade::from_u8(b).is_some()).count();
        assert_eq!(known, 2);
    }

    #[test]
    fn is_zero_sees_one_set_bit_anywhere() {
        for len in [0usize, 1, 255, 256, 257, 1000, 4096] {
            let mut b = vec![0u8; len];
            assert!(is_zero(&b), "len {len}");
            for at in [0, len / 3, len.saturating_sub(1)] {
                if at < len {
                    b[at] = 0x10;
                    assert!(!is_zero(&b), "len {len}, set byte {at}");
                    b[at] = 0;
                }
            }
        }
    }
}
