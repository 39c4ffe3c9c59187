//! Verified reads: every page against its signature; a bad page rebuilt from its group's
//! parity pages, else from its segment's parity blocks; nothing wrong ever returned.

use bitmend_code::sig::Sig64;
use bitmend_media::nand::Nand;

use crate::store::layout::{Kind, Spare};
use crate::store::{PageAddr, PageStore, Repaired};
use crate::FsError;
use crate::{Corruption, FormatError};

/// A group inside a block: first data page, data pages, and where each parity page is.
type GroupAt = (u32, u32, Vec<Option<u32>>);

impl<N: Nand> PageStore<N> {
    /// Reads a page and its spare; the spare only if it decodes.
    fn read_raw(&mut self, page: u32, data: &mut [u8]) -> Result<Option<Spare>, FsError> {
        let mut spare = vec![0u8; self.layout.g.spare_size as usize];
        self.nand.read_page(page, data, &mut spare)?;
        Ok(Spare::decode(&spare, page))
    }

    /// A page whose bytes match the signature in its spare.
    fn read_verified(&mut self, page: u32, data: &mut [u8]) -> Result<Option<Spare>, FsError> {
        Ok(self.read_raw(page, data)?.filter(|s| self.signer.sign(data) == s.sig))
    }

    /// Reads page `addr` into `out`, checked against its signature and repaired if needed.
    pub fn read(&mut self, addr: PageAddr, out: &mut [u8]) -> Result<Repaired, FsError> {
        if out.len() != self.layout.g.page_size as usize {
            return Err(
                FormatError::Config { why: format!("a page is {} bytes", self.layout.g.page_size) }.into()
            );
        }
        if let Some(s) = self.read_verified(addr.0, out)? {
            return match s.kind {
                Kind::Data => Ok(Repaired::No),
                _ => Err(Corruption::NotWritten { page: addr.0 }.into()),
            };
        }
        self.repair(addr.0, out)
    }

    /// Reads page `addr`, which the caller's own records say holds data it checks end to
    /// end (a node's payload, under a CRC-32C): as [`read`](Self::read), and where that
    /// finds nothing on the chip that says the page is data (its spare is gone and its
    /// group's parity page too), the stripe of its sealed segment rebuilds it, else its
    /// bytes are taken as they read ([`Repaired::Unsigned`]). A spare and a parity page lost
    /// together must not cost data the page itself still holds whole.
    pub fn read_claimed(&mut self, addr: PageAddr, out: &mut [u8]) -> Result<Repaired, FsError> {
        match self.read(addr, out) {
            Err(FsError::Corrupt(Corruption::NotWritten { .. } | Corruption::Unrecoverable { .. })) => {}
            done => return done,
        }
        let Some((seg, b, i)) = self.layout.locate(addr.0) else {
            return Err(Corruption::Unrecoverable { page: addr.0 }.into());
        };
        if self.read_raw(addr.0, out)?.is_some() {
            // Its spare decodes: the page is what it says, and no repair matched it.
            return Err(Corruption::Unrecoverable { page: addr.0 }.into());
        }
        if let Some(rebuilt) = self.rebuild_from_segment(seg, b, i, None)? {
            out.copy_from_slice(&rebuilt);
            self.stats.repaired_by_segment += 1;
            return Ok(Repaired::BySegment);
        }
        Ok(Repaired::Unsigned)
    }

    /// Whether page `addr` of a sealed segment holds what its stripe says was programmed
    /// there: its bytes equal the stripe's rebuild of it. `None` when the stripe cannot say
    /// (the segment is not sealed, or too much of the stripe is damaged).
    pub fn matches_stripe(&mut self, addr: PageAddr) -> Result<Option<bool>, FsError> {
        let Some((seg, b, i)) = self.layout.locate(addr.0) else { return Ok(None) };
        let Some(rebuilt) = self.rebuild_from_segment(seg, b, i, None)? else { return Ok(None) };
        let mut held = vec![0u8; self.layout.g.page_size as usize];
        self.nand.read_data(addr.0, &mut held)?;
        Ok(Some(held == rebuilt))
    }

    fn repair(&mut self, page: u32, out: &mut [u8]) -> Result<Repaired, FsError> {
        let Some((seg, b, i)) = self.layout.locate(page) else {
            self.stats.unrecoverable += 1;
            return Err(Corruption::Unrecoverable { page }.into());
        };
        // The page's own spare, if it survived, says what the rebuilt bytes must sign to.
        // Without it, the page must be inside a closed group's data pages (so the bytes
        // rebuilt are known to be file-system data, not parity, padding or a torn program).
        let own = self.read_raw(page, out)?;
        if own.is_some_and(|s| s.kind != Kind::Data) {
            self.stats.unrecoverable += 1;
            return Err(Corruption::Unrecoverable { page }.into());
        }
        if own.is_none() && self.find_group(seg, b, i, None)?.is_none() {
            // Not known to hold data: a torn program, or a page of an open group whose spare
            // is gone (which no parity covers yet).
            return Err(Corruption::NotWritten { page }.into());
        }
        if let Some(rebuilt) = self.rebuild_from_group(seg, b, i, own)? {
            out.copy_from_slice(&rebuilt);
            self.stats.repaired_by_group += 1;
            return Ok(Repaired::ByGroup);
        }
        if let Some(rebuilt) = self.rebuild_from_segment(seg, b, i, own)? {
            out.copy_from_slice(&rebuilt);
            self.stats.repaired_by_segment += 1;
            return Ok(Repaired::BySegment);
        }
        self.stats.unrecoverable += 1;
        Err(Corruption::Unrecoverable { page }.into())
    }

    fn check_rebuilt(&self, data: &[u8], own: Option<Spare>) -> bool {
        own.is_none_or(|s| self.signer.sign(data) == s.sig)
    }

    /// The group whose data pages include page `i` of block `b`, from the spares of the
    /// block's parity pages: (first, len, where each parity page is).
    fn find_group(
        &mut self,
        seg: u32,
        b: u32,
        i: u32,
        own: Option<Spare>,
    ) -> Result<Option<GroupAt>, FsError> {
        let ppb = self.layout.g.pages_per_block;
        let p = self.layout.cfg.parity_pages as usize;
        let first_page = self.layout.page(seg, b, 0);
        let mut spare = vec![0u8; self.layout.g.spare_size as usize];
        let mut parity_at: Vec<Option<u32>> = vec![None; p];
        let mut group: Option<(u32, u32)> = None;
        for j in 0..ppb {
            self.nand.read_spare(first_page + j, &mut spare)?;
            let Some(s) = Spare::decode(&spare, first_page + j) else { continue };
            if s.kind != Kind::GroupParity || (s.index as usize) >= p {
                continue;
            }
            let (first, len) = (s.group_first as u32, s.group_len as u32);
            if (first..first + len).contains(&i) && own.is_none_or(|o| o.group_first as u32 == first) {
                group = Some((first, len));
                parity_at[s.index as usize] = Some(j);
            }
        }
        Ok(group.map(|(f, l)| (f, l, parity_at)))
    }

    /// Rebuilds page `i` of block `b` of segment `seg` from its group, if the group's parity
    /// pages are written and at most p of its pages are bad.
    fn rebuild_from_group(
        &mut self,
        seg: u32,
        b: u32,
        i: u32,
        own: Option<Spare>,
    ) -> Result<Option<Vec<u8>>, FsError> {
        let ps = self.layout.g.page_size as usize;
        let p = self.layout.cfg.parity_pages as usize;
        let kmax = self.layout.max_group() as usize;
        let first_page = self.layout.page(seg, b, 0);
        let Some((first, len, parity_at)) = self.find_group(seg, b, i, own)? else { return Ok(None) };
        if len as usize > kmax {
            return Ok(None);
        }
        // Chunks: data 0..kmax (the group's len pages, zeros after), parity 0..p.
        let mut chunks = vec![0u8; (kmax + p) * ps];
        let mut bad: Vec<usize> = Vec::new();
        let mut buf = vec![0u8; ps];
        for d in 0..len as usize {
            let pg = first_page + first + d as u32;
            let good = pg != first_page + i
                && self.read_verified(pg, &mut buf)?.is_some_and(|s| s.kind == Kind::Data);
            if good {
                chunks[d * ps..(d + 1) * ps].copy_from_slice(&buf);
            } else {
                bad.push(d);
            }
        }
        for (j, at) in parity_at.iter().enumerate() {
            let good = match at {
                Some(j_page) => self.read_verified(first_page + j_page, &mut buf)?.is_some(),
                None => false,
            };
            if good {
                chunks[(kmax + j) * ps..(kmax + j + 1) * ps].copy_from_slice(&buf);
            } else {
                bad.push(kmax + j);
            }
        }
        if bad.len() > p {
            return Ok(None);
        }
        let mut slices: Vec<&mut [u8]> = chunks.chunks_mut(ps).collect();
        if self.group_code.reconstruct(&mut slices, &bad).is_err() {
            return Ok(None);
        }
        let d = (i - first) as usize;
        let rebuilt = chunks[d * ps..(d + 1) * ps].to_vec();
        Ok(self.check_rebuilt(&rebuilt, own).then_some(rebuilt))
    }

    /// Rebuilds page `i` of block `b` from the stripe across the segment's blocks, if the
    /// segment is sealed (its parity blocks written) and at most s pages of the stripe are bad.
    fn rebuild_from_segment(
        &mut self,
        seg: u32,
        b: u32,
        i: u32,
        own: Option<Spare>,
    ) -> Result<Option<Vec<u8>>, FsError> {
        let s = self.layout.cfg.parity_blocks as usize;
        if s == 0 {
            return Ok(None);
        }
        let ps = self.layout.g.page_size as usize;
        let k = self.layout.data_blocks() as usize;
        let mut chunks = vec![0u8; (k + s) * ps];
        let mut bad = Vec::new();
        let mut buf = vec![0u8; ps];
        let mut sealed = false;
        for c in 0..k + s {
            let block = self.layout.block(seg, c as u32);
            if self.nand.is_bad(block)? {
                // A block skipped when the segment was written holds nothing: zero in the
                // code (a parity block that went bad is an erasure).
                if c >= k {
                    bad.push(c);
                }
                continue;
            }
            let pg = self.layout.g.first_page(block) + i;
            if c == b as usize {
                bad.push(c);
                continue;
            }
            match self.read_verified(pg, &mut buf)? {
                Some(sp) => {
                    sealed |= sp.kind == Kind::SegmentParity;
                    chunks[c * ps..(c + 1) * ps].copy_from_slice(&buf);
                }
                None => bad.push(c),
            }
        }
        if !sealed || bad.len() > s {
            return Ok(None);
        }
        let mut slices: Vec<&mut [u8]> = chunks.chunks_mut(ps).collect();
        if self.seg_code.reconstruct(&mut slices, &bad).is_err() {
            return Ok(None);
        }
        let rebuilt = chunks[b as usize * ps..(b as usize + 1) * ps].to_vec();
        Ok(self.check_rebuilt(&rebuilt, own).then_some(rebuilt))
    }

    /// The signature of `data` (for tests and tools that build expectations).
    pub fn sign(&self, data: &[u8]) -> Sig64 {
        self.signer.sign(data)
    }
}
