//! A fuzzer's input as damage: patches of bytes at places in an image.

/// Bytes to write over an image at `at` (taken modulo the image's length).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Patch<'a> {
    pub at: u64,
    pub bytes: &'a [u8],
}

/// The patches of `data`: each is a 4-byte little-endian place, a length byte, then that
/// many bytes (fewer at the input's end). Any input parses: a fuzzer's mutations move
/// places and lengths as readily as bytes.
pub fn patches(data: &[u8]) -> impl Iterator<Item = Patch<'_>> {
    let mut rest = data;
    std::iter::from_fn(move || {
        if rest.len() < 5 {
            return None;
        }
        let at = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as u64;
        let len = (rest[4] as usize).min(rest.len() - 5);
        let bytes = &rest[5..5 + len];
        rest = &rest[5 + len..];
        Some(Patch { at, bytes })
    })
}

/// Applies `data`'s patches to `image` through `write(at, bytes)`, each clipped to the
/// image's end.
pub(crate) fn apply(data: &[u8], len: u64, mut write: impl FnMut(u64, &[u8])) {
    for p in patches(data) {
        let at = p.at % len;
        let n = p.bytes.len().min((len - at) as usize);
        write(at, &p.bytes[..n]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inputs_parse_into_patches() {
        let data = [1, 0, 0, 0, 2, 0xAA, 0xBB, 9, 0, 0, 0, 5, 0xCC];
        let got: Vec<Patch> = patches(&data).collect();
        assert_eq!(got, vec![Patch { at: 1, bytes: &[0xAA, 0xBB] }, Patch { at: 9, bytes: &[0xCC] }]);
        assert_eq!(patches(&[1, 2, 3]).count(), 0);
        let mut seen = Vec::new();
        apply(&data, 10, |at, b| seen.push((at, b.to_vec())));
        assert_eq!(seen, vec![(1, vec![0xAA, 0xBB]), (9, vec![0xCC])]);
    }
}
