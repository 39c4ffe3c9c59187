//! Checking chunks and rebuilding damaged ones from the rest of their segment.
//!
//! What each data chunk must look like:
//! - a closed chunk has the signature its segment header records;
//! - the live chunk holds valid records up to the tail and zeros after it;
//! - a chunk after the live one is all zeros.
//!
//! A chunk that fails is rebuilt from the other chunks by the Reed–Solomon code: with b bad
//! data chunks, every choice of b parity chunks is tried until the rebuilt chunks pass their
//! checks, so damage to some parity chunks as well is survived as long as at most m chunks of
//! the segment are bad in all. Parity chunks are checked through the commuting property: the
//! signature of parity chunk j must equal row j of the code applied to the data chunks'
//! signatures. Bytes that should be zero and are not (stray writes past the tail) are zeroed:
//! the parity already describes zeros there.

use bitmend_code::le;
use bitmend_code::sig::Sig64;
use bitmend_media::pmem::Region;

use crate::log::NvLog;
use crate::record::{self, HEADER};
use crate::LogError;

/// What a data chunk must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Expect {
    Sig(Sig64),
    /// Valid records up to exactly `end`, zeros after.
    Chain {
        end: usize,
    },
    /// Valid records, then zeros.
    ChainAny,
    Zero,
    /// Anything (a chunk recovery will judge itself).
    Any,
}

/// All r-element subsets of 0..n, in lexicographic order.
fn subsets(n: usize, r: usize) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    let mut cur: Vec<usize> = (0..r).collect();
    if r > n {
        return out;
    }
    loop {
        out.push(cur.clone());
        let Some(i) = (0..r).rev().find(|&i| cur[i] < n - r + i) else { return out };
        cur[i] += 1;
        for j in i + 1..r {
            cur[j] = cur[j - 1] + 1;
        }
    }
}

impl<R: Region> NvLog<R> {
    pub(crate) fn expect(&self, seg: u64, i: usize) -> Expect {
        if let Some(s) = self.expected_data_sig(seg, i) {
            return Expect::Sig(s);
        }
        match self.tail {
            Some(t) if t.seg == seg && i == t.chunk => Expect::Chain { end: t.off },
            Some(t) if t.seg == seg && i > t.chunk => Expect::Zero,
            _ => Expect::ChainAny,
        }
    }

    pub(crate) fn passes(&self, bytes: &[u8], seg: u64, i: usize, e: Expect) -> bool {
        let block = self.layout.cfg.block_size;
        match e {
            Expect::Sig(s) => self.signer.sign(bytes) == s,
            Expect::Chain { end } => {
                let c = record::chain(bytes, self.id_at(seg, i, 0), block);
                !c.broken && c.end == end && c.clean_tail
            }
            Expect::ChainAny => {
                let c = record::chain(bytes, self.id_at(seg, i, 0), block);
                !c.broken && c.clean_tail
            }
            Expect::Zero => le::is_zero(bytes),
            Expect::Any => true,
        }
    }

    /// Checks data chunk `i` of `seg`; on a mismatch checks and repairs the whole segment.
    pub(crate) fn verify_chunk(&mut self, seg: u64, i: usize) -> Result<(), LogError> {
        if self.lost.contains(&(seg, i)) {
            return Err(LogError::Unrecoverable { segment: seg, chunk: i });
        }
        self.stats.chunks_verified += 1;
        let p = self.layout.physical(seg);
        if self.passes(self.chunk_bytes(p, i), seg, i, self.expect(seg, i)) {
            return Ok(());
        }
        self.check_segment(seg)?;
        if self.lost.contains(&(seg, i)) {
            return Err(LogError::Unrecoverable { segment: seg, chunk: i });
        }
        Ok(())
    }

    pub(crate) fn zero_range(&mut self, at: usize, len: usize) -> Result<(), LogError> {
        self.region.update(at, len, &mut |b| b.fill(0))?;
        self.region.flush(at, len)?;
        Ok(())
    }

    fn mark_lost(&mut self, seg: u64, chunks: &[usize]) -> LogError {
        for &i in chunks {
            if self.lost.insert((seg, i)) {
                self.stats.unrecoverable_chunks += 1;
            }
        }
        LogError::Unrecoverable { segment: seg, chunk: chunks[0] }
    }

    /// Checks every chunk of `seg` and repairs what the code allows. Returns the signatures of
    /// all n chunks (the parity ones as the data ones combine to). Damage beyond m chunks marks
    /// the bad chunks lost and returns `Unrecoverable`; nothing is rewritten from guesses.
    pub(crate) fn check_segment(&mut self, seg: u64) -> Result<Vec<Sig64>, LogError> {
        let cfg = self.layout.cfg;
        let (k, m, cs) = (cfg.k, cfg.m, cfg.chunk_size);
        let p = self.layout.physical(seg);
        let exp: Vec<Expect> = (0..k).map(|i| self.expect(seg, i)).collect();
        // Parity may be rewritten below: the append path's copy is reloaded when next used.
        if self.shadow_seg == Some(seg) {
            self.shadow_seg = None;
        }

        // Zeros where zeros belong: no decoding needed, the parity already holds zeros there.
        for (i, e) in exp.iter().enumerate() {
            let at = self.layout.chunk(p, i);
            let bytes = self.chunk_bytes(p, i);
            let stray = match *e {
                Expect::Zero if bytes.iter().any(|&b| b != 0) => Some(0),
                Expect::Chain { end } => {
                    let c = record::chain(bytes, self.id_at(seg, i, 0), cfg.block_size);
                    (!c.broken && c.end == end && !c.clean_tail).then_some(end)
                }
                _ => None,
            };
            if let Some(from) = stray {
                self.zero_range(at + from, cs - from)?;
                self.note(crate::Repair {
                    segment: seg,
                    chunk: i,
                    cause: crate::Cause::Garbage,
                    tags: vec![],
                });
            }
        }

        let bad: Vec<usize> =
            (0..k).filter(|&i| !self.passes(self.chunk_bytes(p, i), seg, i, exp[i])).collect();
        if !bad.is_empty() {
            if bad.len() > m {
                self.region.fence()?;
                return Err(self.mark_lost(seg, &bad));
            }
            let Some(rebuilt) = self.try_decode(seg, &bad, &exp) else {
                self.region.fence()?;
                return Err(self.mark_lost(seg, &bad));
            };
            for (i, bytes) in rebuilt {
                let at = self.layout.chunk(p, i);
                let old = self.chunk_bytes(p, i).to_vec();
                self.region.write(at, &bytes)?;
                self.region.flush(at, cs)?;
                let tags = changed_tags(&old, &bytes, self.id_at(seg, i, 0), cfg.block_size);
                self.note(crate::Repair { segment: seg, chunk: i, cause: crate::Cause::DataChunk, tags });
            }
        }

        let mut sigs: Vec<Sig64> = (0..k)
            .map(|i| match exp[i] {
                Expect::Sig(s) => s,
                Expect::Zero => Sig64::ZERO,
                _ => self.signer.sign(self.chunk_bytes(p, i)),
            })
            .collect();
        let expected: Vec<Sig64> = (0..m).map(|j| Sig64::combine(self.codec.parity_row(j), &sigs)).collect();
        let bad_parity: Vec<usize> =
            (0..m).filter(|&j| self.signer.sign(self.chunk_bytes(p, k + j)) != expected[j]).collect();
        if !bad_parity.is_empty() {
            let mut parity = vec![0u8; m * cs];
            {
                let data: Vec<&[u8]> = (0..k).map(|i| self.chunk_bytes(p, i)).collect();
                let mut outs: Vec<&mut [u8]> = parity.chunks_mut(cs).collect();
                self.codec.encode(&data, &mut outs).expect("shapes match the codec");
            }
            for &j in &bad_parity {
                let at = self.layout.chunk(p, k + j);
                self.region.write(at, &parity[j * cs..(j + 1) * cs])?;
                self.region.flush(at, cs)?;
                self.note(crate::Repair {
                    segment: seg,
                    chunk: k + j,
                    cause: crate::Cause::ParityChunk,
                    tags: vec![],
                });
            }
        }
        sigs.extend(expected);
        self.region.fence()?;
        Ok(sigs)
    }

    /// Rebuilds data chunks `bad` of `seg` from the others, trying every choice of parity
    /// chunks; returns the first rebuild in which each chunk passes its check.
    pub(crate) fn try_decode(
        &self,
        seg: u64,
        bad: &[usize],
        exp: &[Expect],
    ) -> Option<Vec<(usize, Vec<u8>)>> {
        self.decode_with(seg, bad, exp, true).into_iter().next()
    }

    /// Every passing rebuild, one per choice of parity chunks.
    pub(crate) fn decode_all(&self, seg: u64, bad: &[usize], exp: &[Expect]) -> Vec<Vec<(usize, Vec<u8>)>> {
        self.decode_with(seg, bad, exp, false)
    }

    fn decode_with(
        &self,
        seg: u64,
        bad: &[usize],
        exp: &[Expect],
        first: bool,
    ) -> Vec<Vec<(usize, Vec<u8>)>> {
        let cfg = self.layout.cfg;
        let (k, m, cs) = (cfg.k, cfg.m, cfg.chunk_size);
        let p = self.layout.physical(seg);
        let all = self.region.bytes()[self.layout.chunks(p)].to_vec();
        let mut found = Vec::new();
        for chosen in subsets(m, bad.len()) {
            let mut erased: Vec<usize> = bad.to_vec();
            erased.extend((0..m).filter(|j| !chosen.contains(j)).map(|j| k + j));
            let mut work = all.clone();
            {
                let mut slices: Vec<&mut [u8]> = work.chunks_mut(cs).collect();
                if self.codec.reconstruct(&mut slices, &erased).is_err() {
                    continue;
                }
            }
            if bad.iter().all(|&i| self.passes(&work[i * cs..(i + 1) * cs], seg, i, exp[i])) {
                found.push(bad.iter().map(|&i| (i, work[i * cs..(i + 1) * cs].to_vec())).collect());
                if first {
                    break;
                }
            }
        }
        found
    }
}

/// Tags of the records in `new` whose bytes differ in `old`.
fn changed_tags(old: &[u8], new: &[u8], chunk_id: u64, block: usize) -> Vec<u16> {
    record::chain(new, chunk_id, block)
        .records
        .iter()
        .filter(|r| old[r.off..r.off + HEADER + r.len] != new[r.off..r.off + HEADER + r.len])
        .map(|r| r.tag)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::subsets;

    #[test]
    fn subsets_in_order() {
        assert_eq!(
            subsets(4, 2),
            vec![vec![0, 1], vec![0, 2], vec![0, 3], vec![1, 2], vec![1, 3], vec![2, 3]]
        );
        assert_eq!(subsets(3, 0), vec![Vec::<usize>::new()]);
        assert_eq!(subsets(2, 2), vec![vec![0, 1]]);
        assert!(subsets(1, 2).is_empty());
    }
}
