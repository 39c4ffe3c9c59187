//! Systematic Reed–Solomon erasure codes over GF(2^8), byte-compatible with ISA-L.
//!
//! A [`Codec`] of shape (k, m) turns k data chunks into m parity chunks with ISA-L's Cauchy
//! matrix ([`matrix::cauchy`]), so parity bytes equal `ec_encode_data`'s for the same inputs.
//! Any k of the k + m chunks recover the others. [`Codec::update`] patches the parity for a
//! sub-range of one data chunk in O(m * len): the small-write path of the PRIMS log.

pub mod matrix;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::gf::{engine, Engine};

/// Errors of the erasure code. Shapes are the caller's; erasures beyond m are the medium's.
#[non_exhaustive]
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodeError {
    /// k or m out of range.
    #[error("invalid code shape k={k} m={m}: need k >= 1 and k + m <= 255")]
    Shape { k: usize, m: usize },
    /// The wrong number of chunks was passed.
    #[error("expected {expected} chunks, got {got}")]
    ChunkCount { expected: usize, got: usize },
    /// Chunks of different lengths.
    #[error("chunk {index} is {len} bytes, the others {expected}")]
    ChunkLen { index: usize, len: usize, expected: usize },
    /// More chunks lost than the code can recover.
    #[error("{erased} chunks erased, at most {m} can be recovered")]
    TooManyErasures { erased: usize, m: usize },
    /// An erased index out of range or repeated.
    #[error("erasure index {index} invalid for {n} chunks (out of range or repeated)")]
    ErasureIndex { index: usize, n: usize },
    /// A data chunk index out of range.
    #[error("data chunk {index} out of range (k = {k})")]
    DataIndex { index: usize, k: usize },
    /// An update range outside the chunk.
    #[error("range {off}+{len} outside a {chunk_len}-byte chunk")]
    Range { off: usize, len: usize, chunk_len: usize },
}

type Result<T> = std::result::Result<T, CodeError>;

/// The decoding plan for one erasure pattern: which chunks to read, and one row of
/// coefficients over them per erased chunk.
struct Plan {
    survivors: Vec<usize>,
    rows: Vec<u8>,
}

/// A Reed–Solomon code of k data and m parity chunks.
pub struct Codec {
    k: usize,
    m: usize,
    matrix: Vec<u8>,
    /// Column i of the parity rows, per data chunk i: what `update` multiplies a delta by.
    columns: Vec<u8>,
    engine: &'static dyn Engine,
    plans: Mutex<HashMap<[u64; 4], Arc<Plan>>>,
}

impl std::fmt::Debug for Codec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Codec")
            .field("k", &self.k)
            .field("m", &self.m)
            .field("engine", &self.engine.name())
            .finish()
    }
}

impl Codec {
    /// A code of shape (k, m) on the process-wide engine.
    pub fn new(k: usize, m: usize) -> Result<Self> {
        Self::with_engine(k, m, engine())
    }

    /// A code of shape (k, m) on a chosen engine (tests and benches compare engines).
    pub fn with_engine(k: usize, m: usize, engine: &'static dyn Engine) -> Result<Self> {
        if k == 0 || k + m > 255 {
            return Err(CodeError::Shape { k, m });
        }
        let matrix = matrix::cauchy(k, m);
        let columns =
            (0..k).flat_map(|i| (0..m).map(move |j| (i, j))).map(|(i, j)| matrix[(k + j) * k + i]).collect();
        Ok(Codec { k, m, matrix, columns, engine, plans: Mutex::new(HashMap::new()) })
    }

    /// Data chunks per stripe.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Parity chunks per stripe.
    pub fn m(&self) -> usize {
        self.m
    }

    /// The engine this codec runs on.
    pub fn engine(&self) -> &'static dyn Engine {
        self.engine
    }

    /// The k coefficients of parity chunk `j` (0-based among the parity chunks):
    /// parity_j = sum_i row[i] * data_i. Signatures combine with the same row.
    pub fn parity_row(&self, j: usize) -> &[u8] {
        let r = self.k + j;
        &self.matrix[r * self.k..(r + 1) * self.k]
    }

    /// The m coefficients of data chunk `i` in the parity rows: parity_j changes by
    /// column[j] * delta when data chunk i changes by delta (what `update` applies).
    pub fn parity_column(&self, i: usize) -> &[u8] {
        &self.columns[i * self.m..(i + 1) * self.m]
    }

    /// Fills the m `parity` chunks from the k `data` chunks.
    pub fn encode(&self, data: &[&[u8]], parity: &mut [&mut [u8]]) -> Result<()> {
        self.check_count(data.len(), self.k)?;
        self.check_count(parity.len(), self.m)?;
        let len = data[0].len();
        check_lens(data.iter().map(|d| d.len()).chain(parity.iter().map(|p| p.len())), len)?;
        if self.m > 0 {
            self.engine.dot_prod(&self.matrix[self.k * self.k..], data, parity, false);
        }
        Ok(())
    }

    /// Recomputes the chunks listed in `erased` (indices 0..k are data, k..k+m parity) from
    /// the others, in place. `chunks` holds all k + m chunks; the erased ones are overwritten.
    pub fn reconstruct(&self, chunks: &mut [&mut [u8]], erased: &[usize]) -> Result<()> {
        let n = self.k + self.m;
        self.check_count(chunks.len(), n)?;
        check_lens(chunks.iter().map(|c| c.len()), chunks[0].len())?;
        let mut mask = [0u64; 4];
        for &e in erased {
            if e >= n || mask[e / 64] & (1 << (e % 64)) != 0 {
                return Err(CodeError::ErasureIndex { index: e, n });
            }
            mask[e / 64] |= 1 << (e % 64);
        }
        if erased.len() > self.m {
            return Err(CodeError::TooManyErasures { erased: erased.len(), m: self.m });
        }
        if erased.is_empty() {
            return Ok(());
        }
        let plan = self.plan(mask)?;
        let is_erased = |i: usize| mask[i / 64] & (1 << (i % 64)) != 0;
        let mut srcs: Vec<&[u8]> = Vec::with_capacity(self.k);
        let mut outs: Vec<&mut [u8]> = Vec::with_capacity(erased.len());
        let mut next_survivor = plan.survivors.iter().peekable();
        for (i, c) in chunks.iter_mut().enumerate() {
            if is_erased(i) {
                outs.push(c);
            } else if next_survivor.peek() == Some(&&i) {
                next_survivor.next();
                srcs.push(c);
            }
        }
        self.engine.dot_prod(&plan.rows, &srcs, &mut outs, false);
        Ok(())
    }

    /// Patches the m `parity` chunks after bytes [off, off + old.len()) of data chunk `index`
    /// changed from `old` to `new`. Touches only that range of each parity chunk.
    pub fn update(
        &self,
        index: usize,
        off: usize,
        old: &[u8],
        new: &[u8],
        parity: &mut [&mut [u8]],
    ) -> Result<()> {
        if index >= self.k {
            return Err(CodeError::DataIndex { index, k: self.k });
        }
        self.check_count(parity.len(), self.m)?;
        if self.m == 0 {
            return Ok(());
        }
        let chunk_len = parity[0].len();
        check_lens(parity.iter().map(|p| p.len()), chunk_len)?;
        let len = old.len();
        if new.len() != len {
            return Err(CodeError::ChunkLen { index, len: new.len(), expected: len });
        }
        if off.checked_add(len).is_none_or(|end| end > chunk_len) {
            return Err(CodeError::Range { off, len, chunk_len });
        }
        // The parity is linear: it changes by column(index) * (old ^ new).
        self.engine.update_parity(self.parity_column(index), old, new, parity, off);
        Ok(())
    }

    fn check_count(&self, got: usize, expected: usize) -> Result<()> {
        if got == expected {
            Ok(())
        } else {
            Err(CodeError::ChunkCount { expected, got })
        }
    }

    /// The cached plan for an erasure pattern, built on first use (inverting a k x k matrix
    /// costs O(k^3), far more than decoding a small chunk).
    fn plan(&self, mask: [u64; 4]) -> Result<Arc<Plan>> {
        let mut plans = self.plans.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = plans.get(&mask) {
            return Ok(p.clone());
        }
        let k = self.k;
        let is_erased = |i: usize| mask[i / 64] & (1 << (i % 64)) != 0;
        let survivors: Vec<usize> = (0..k + self.m).filter(|&i| !is_erased(i)).take(k).collect();
        let sub: Vec<u8> =
            survivors.iter().flat_map(|&r| self.matrix[r * k..(r + 1) * k].iter().copied()).collect();
        let decode = matrix::invert(&sub, k).expect("square submatrices of a Cauchy code are invertible");
        let mut rows = Vec::new();
        for e in (0..k + self.m).filter(|&i| is_erased(i)) {
            if e < k {
                rows.extend_from_slice(&decode[e * k..(e + 1) * k]);
            } else {
                rows.extend(matrix::row_times(&self.matrix[e * k..(e + 1) * k], &decode, k));
            }
        }
        let plan = Arc::new(Plan { survivors, rows });
        if plans.len() >= 4096 {
            plans.clear();
        }
        plans.insert(mask, plan.clone());
        Ok(plan)
    }
}

fn check_lens(lens: impl Iterator<Item = usize>, expected: usize) -> Result<()> {
    for (index, len) in lens.enumerate() {
        if len != expected {
            return Err(CodeError::ChunkLen { index, len, expected });
        }
    }
    Ok(())
}
