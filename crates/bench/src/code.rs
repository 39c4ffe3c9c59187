//! `bitmend bench code`: the coding core beside ISA-L (and memcpy, and the crc32c crate).
//! Each erasure-code and CRC row is measured against both ISA-L builds there are (2.31,
//! bundled, with GFNI kernels; Debian's 2.30 when installed), one row each, the anchor named
//! with the kernel family its dispatcher runs on this CPU.

use bitmend_anchors::isal::{Isal, Kernel};
use bitmend_code::crc;
use bitmend_code::rs::{matrix, Codec};
use bitmend_code::sig::{Signature, Signer};
use bitmend_code::testdata::pattern as bytes;

use crate::harness::{compare, keep, Options, Row};

const KIB: usize = 1024;

fn size_name(len: usize) -> String {
    if len >= 1 << 20 {
        format!("{}MiB", len >> 20)
    } else {
        format!("{}KiB", len / KIB)
    }
}

/// The anchor's name: the build and the erasure-code kernel family it runs.
fn ec_anchor(isal: &Isal, kernel: Kernel) -> String {
    format!("{} {}", isal.name(), isal.ec_family(kernel))
}

/// Runs every case, calling `emit` with each row as soon as it is measured.
pub fn run(opts: &Options, emit: &mut dyn FnMut(Row)) {
    let shapes: &[(usize, usize)] =
        if opts.quick { &[(10, 4), (8, 2)] } else { &[(10, 4), (4, 2), (8, 1), (8, 2), (8, 4)] };
    let sizes: &[usize] = if opts.quick { &[4 * KIB, 64 * KIB] } else { &[4 * KIB, 64 * KIB, 1 << 20] };
    let builds = Isal::all();
    for &(k, m) in shapes {
        for &len in sizes {
            for isal in &builds {
                encode(opts, (k, m, len), isal, Kernel::Dispatch, emit);
                if (k, m) == (10, 4) && isal.ec_family(Kernel::Dispatch) != "avx2" {
                    encode(opts, (k, m, len), isal, Kernel::Avx2, emit);
                }
            }
        }
    }
    encode_memcpy(opts, 10, 64 * KIB, emit);
    for isal in &builds {
        for lost in [1, 4] {
            reconstruct(opts, (10, 4, 64 * KIB), lost, isal, emit);
        }
        for m in [1, 2, 4] {
            update(opts, m, None, isal, emit);
        }
        update(opts, 4, Some(64), isal, emit);
    }
    for len in [2 * KIB, 4 * KIB, 64 * KIB] {
        signature::<2>(opts, len, emit);
        signature::<4>(opts, len, emit);
    }
    signature_update::<2>(opts, emit);
    signature_update::<4>(opts, emit);
    crc32c(opts, &builds, emit);
}

fn encode(
    opts: &Options,
    (k, m, len): (usize, usize, usize),
    isal: &Isal,
    kernel: Kernel,
    emit: &mut dyn FnMut(Row),
) {
    let codec = Codec::new(k, m).expect("valid shape");
    let data: Vec<Vec<u8>> = (0..k).map(|i| bytes(i as u64 + 1, len)).collect();
    let d: Vec<&[u8]> = data.iter().map(|x| x.as_slice()).collect();
    let mut ours = vec![vec![0u8; len]; m];
    let mut theirs = vec![vec![0u8; len]; m];
    let mut tables = isal.tables(k, m, &matrix::cauchy(k, m)[k * k..], kernel);
    let mut f_ours = || {
        let mut p: Vec<&mut [u8]> = ours.iter_mut().map(|x| x.as_mut_slice()).collect();
        codec.encode(&d, &mut p).expect("shapes match");
        keep(&p);
    };
    let mut f_isal = || {
        let mut p: Vec<&mut [u8]> = theirs.iter_mut().map(|x| x.as_mut_slice()).collect();
        tables.encode(&d, &mut p);
        keep(&p);
    };
    let (ns, ans) = compare(opts, &mut f_ours, Some(&mut f_isal));
    assert_eq!(ours, theirs, "parity differs from {}", isal.name());
    emit(Row::throughput(
        format!("rs-encode k={k} m={m} {} [{}]", size_name(len), codec.engine().name()),
        k * len,
        ns,
        &ec_anchor(isal, kernel),
        ans,
    ));
}

/// The limit: copying the k data chunks once.
fn encode_memcpy(opts: &Options, k: usize, len: usize, emit: &mut dyn FnMut(Row)) {
    let codec = Codec::new(k, 4).expect("valid shape");
    let data: Vec<Vec<u8>> = (0..k).map(|i| bytes(i as u64 + 1, len)).collect();
    let d: Vec<&[u8]> = data.iter().map(|x| x.as_slice()).collect();
    let mut parity = vec![vec![0u8; len]; 4];
    let mut copy = vec![vec![0u8; len]; k];
    let mut f_ours = || {
        let mut p: Vec<&mut [u8]> = parity.iter_mut().map(|x| x.as_mut_slice()).collect();
        codec.encode(&d, &mut p).expect("shapes match");
        keep(&p);
    };
    let mut f_copy = || {
        for (c, s) in copy.iter_mut().zip(&data) {
            c.copy_from_slice(s);
        }
        keep(&copy);
    };
    let (ns, ans) = compare(opts, &mut f_ours, Some(&mut f_copy));
    emit(Row::throughput(
        format!("rs-encode k={k} m=4 {} vs copying the data", size_name(len)),
        k * len,
        ns,
        "memcpy",
        ans,
    ));
}

fn reconstruct(
    opts: &Options,
    (k, m, len): (usize, usize, usize),
    lost: usize,
    isal: &Isal,
    emit: &mut dyn FnMut(Row),
) {
    let codec = Codec::new(k, m).expect("valid shape");
    let mut chunks: Vec<Vec<u8>> = (0..k).map(|i| bytes(i as u64 + 1, len)).collect();
    chunks.extend((0..m).map(|_| vec![0u8; len]));
    {
        let (d, p) = chunks.split_at_mut(k);
        let d: Vec<&[u8]> = d.iter().map(|x| x.as_slice()).collect();
        let mut p: Vec<&mut [u8]> = p.iter_mut().map(|x| x.as_mut_slice()).collect();
        codec.encode(&d, &mut p).expect("shapes match");
    }
    let good = chunks.clone();
    // Lose data chunks 0, 3, 6, 9 (the costly case: data, not parity).
    let erased: Vec<usize> = (0..lost).map(|i| (i * 3) % k).collect();
    let mut ours = chunks.clone();
    let mut f_ours = || {
        let mut v: Vec<&mut [u8]> = ours.iter_mut().map(|x| x.as_mut_slice()).collect();
        codec.reconstruct(&mut v, &erased).expect("within m");
        keep(&v);
    };
    // ISA-L's documented decode: invert the survivors' matrix, build tables, dot products.
    let full = matrix::cauchy(k, m);
    let mut theirs = chunks.clone();
    let mut f_isal = || {
        let survivors: Vec<usize> = (0..k + m).filter(|i| !erased.contains(i)).take(k).collect();
        let sub: Vec<u8> = survivors.iter().flat_map(|&r| full[r * k..(r + 1) * k].to_vec()).collect();
        let inv = isal.invert(&sub, k).expect("invertible");
        let rows: Vec<u8> = erased.iter().flat_map(|&e| inv[e * k..(e + 1) * k].to_vec()).collect();
        let mut t = isal.tables(k, erased.len(), &rows, Kernel::Dispatch);
        let (srcs, outs): (Vec<_>, Vec<_>) =
            theirs.iter_mut().enumerate().partition(|(i, _)| survivors.contains(i));
        let srcs: Vec<&[u8]> = srcs.into_iter().map(|(_, c)| &c[..]).collect();
        let mut outs: Vec<&mut [u8]> =
            outs.into_iter().filter(|(i, _)| erased.contains(i)).map(|(_, c)| c.as_mut_slice()).collect();
        t.encode(&srcs, &mut outs);
        keep(&outs);
    };
    let (ns, ans) = compare(opts, &mut f_ours, Some(&mut f_isal));
    assert_eq!(ours, good, "reconstruction is wrong");
    assert_eq!(theirs, good, "{} reconstruction is wrong", isal.name());
    emit(Row::throughput(
        format!("rs-reconstruct k={k} m={m} {} lost={lost}", size_name(len)),
        k * len,
        ns,
        &ec_anchor(isal, Kernel::Dispatch),
        ans,
    ));
}

/// Parity update of a random 10..100-byte range (or a fixed size) of a 4 KiB chunk, k = 8.
fn update(opts: &Options, m: usize, fixed: Option<usize>, isal: &Isal, emit: &mut dyn FnMut(Row)) {
    let (k, len) = (8, 4 * KIB);
    let codec = Codec::new(k, m).expect("valid shape");
    let chunk = bytes(3, len);
    let fresh = bytes(4, len);
    let ranges: Vec<(usize, usize)> = (0..1024)
        .map(|i| {
            let n = fixed.unwrap_or(10 + (i * 37) % 91);
            ((i * 997) % (len - n), n)
        })
        .collect();
    let mut ours = vec![vec![0u8; len]; m];
    let mut theirs = vec![vec![0u8; len]; m];
    let mut tables = isal.tables(k, m, &matrix::cauchy(k, m)[k * k..], Kernel::Dispatch);
    let (mut i, mut j) = (0, 0);
    let mut f_ours = || {
        let (off, n) = ranges[i % ranges.len()];
        i += 1;
        let mut p: Vec<&mut [u8]> = ours.iter_mut().map(|x| x.as_mut_slice()).collect();
        codec.update(2, off, &chunk[off..off + n], &fresh[off..off + n], &mut p).expect("in range");
    };
    let mut f_isal = || {
        let (off, n) = ranges[j % ranges.len()];
        j += 1;
        let mut delta = [0u8; 128];
        for ((d, a), b) in delta.iter_mut().zip(&chunk[off..off + n]).zip(&fresh[off..off + n]) {
            *d = a ^ b;
        }
        let mut p: Vec<&mut [u8]> = theirs.iter_mut().map(|x| &mut x[off..off + n]).collect();
        tables.update(2, &delta[..n], &mut p);
    };
    let (ns, ans) = compare(opts, &mut f_ours, Some(&mut f_isal));
    let what = fixed.map_or("10..100B".to_string(), |n| format!("{n}B"));
    emit(Row::latency(format!("rs-update {what} m={m}"), ns, &ec_anchor(isal, Kernel::Dispatch), ans));
}

fn signature<const N: usize>(opts: &Options, len: usize, emit: &mut dyn FnMut(Row)) {
    let signer = Signer::<N>::new();
    let data = bytes(9, len);
    let mut f_ours = || {
        keep(signer.sign(keep(&data)));
    };
    let isal = Isal::bundled();
    let mut f_isal = || {
        keep(isal.crc32c(Kernel::Dispatch, keep(&data)));
    };
    let (ns, ans) = compare(opts, &mut f_ours, Some(&mut f_isal));
    emit(Row::throughput(
        format!("signature {}-bit {} [{}]", 16 * N, size_name(len), signer.engine().name()),
        len,
        ns,
        "isa-l crc32c",
        ans,
    ));
}

/// A 64-byte change in a 4 KiB chunk: our incremental signature update, beside what a
/// checksum-only design pays (recomputing ISA-L's CRC-32C over the chunk).
fn signature_update<const N: usize>(opts: &Options, emit: &mut dyn FnMut(Row)) {
    let len = 4 * KIB;
    let data = bytes(10, len);
    let fresh = bytes(11, len);
    let signer = Signer::<N>::new();
    let mut sig = Signature::<N>::ZERO;
    let mut i = 0;
    let mut f_ours = || {
        let off = (i * 64 + 8) % (len - 64);
        i += 1;
        sig = signer.update(sig, off, &data[off..off + 64], &fresh[off..off + 64]);
    };
    let isal = Isal::bundled();
    let mut f_isal = || {
        keep(isal.crc32c(Kernel::Dispatch, keep(&data)));
    };
    let (ns, ans) = compare(opts, &mut f_ours, Some(&mut f_isal));
    keep(sig);
    emit(Row::latency(format!("signature-update {}-bit 64B in 4KiB", 16 * N), ns, "isa-l crc32c 4KiB", ans));
}

fn crc32c(opts: &Options, builds: &[Isal], emit: &mut dyn FnMut(Row)) {
    // A page is reported as a time, a megabyte as a throughput.
    for len in [4 * KIB, 1 << 20] {
        let data = bytes(12, len);
        let row = |ns: f64, anchor: &str, ans: Option<f64>| {
            let case = format!("crc32c {}", size_name(len));
            if len <= 4 * KIB {
                Row::latency(case, ns, anchor, ans)
            } else {
                Row::throughput(case, len, ns, anchor, ans)
            }
        };
        let mut f_ours = || {
            keep(crc::crc32c(keep(&data)));
        };
        for (isal, kernel) in builds.iter().flat_map(|b| [(b, Kernel::Dispatch), (b, Kernel::Avx2)]) {
            let mut f_isal = || {
                keep(isal.crc32c(kernel, keep(&data)));
            };
            let (ns, ans) = compare(opts, &mut f_ours, Some(&mut f_isal));
            emit(row(ns, &format!("{} {}", isal.name(), isal.crc_family(kernel)), ans));
        }
        let mut f_crate = || {
            keep(crc32c::crc32c(keep(&data)));
        };
        let (ns, ans) = compare(opts, &mut f_ours, Some(&mut f_crate));
        emit(row(ns, "crc32c crate", ans));
    }
    // combine: ours (table-built shift, general length) beside the crate's zlib-style combine.
    let lens: Vec<u64> = (0..256).map(|i| 1 + (i * 7919) % 100_000).collect();
    let (mut i, mut j) = (0usize, 0usize);
    let mut f_ours = || {
        let l = lens[i % lens.len()];
        i += 1;
        keep(crc::combine(0x1234_5678, 0x9ABC_DEF0, keep(l)));
    };
    let mut f_crate = || {
        let l = lens[j % lens.len()];
        j += 1;
        keep(crc32c::crc32c_combine(0x1234_5678, 0x9ABC_DEF0, keep(l) as usize));
    };
    let (ns, ans) = compare(opts, &mut f_ours, Some(&mut f_crate));
    emit(Row::latency("crc32c combine (any length)".into(), ns, "crc32c crate", ans));
    // The Loris partial update: 64 bytes changed in a 4 KiB page, beside recomputing it.
    let page = bytes(13, 4 * KIB);
    let fresh = bytes(14, 4 * KIB);
    let mut c = crc::crc32c(&page);
    let mut i = 0usize;
    let mut f_ours = || {
        let off = (i * 64) % (4 * KIB - 64);
        i += 1;
        c = crc::update(c, 4 * KIB, off, &page[off..off + 64], &fresh[off..off + 64]);
    };
    let isal = Isal::bundled();
    let mut f_isal = || {
        keep(isal.crc32c(Kernel::Dispatch, keep(&page)));
    };
    let (ns, ans) = compare(opts, &mut f_ours, Some(&mut f_isal));
    keep(c);
    emit(Row::latency("crc32c update 64B in 4KiB".into(), ns, "isa-l crc32c 4KiB", ans));
    // The heap's line checks: a CRC per 64-byte line of a 4 KiB page, four lines in flight,
    // beside ISA-L's CRC called a line at a time (how a check per line is taken otherwise).
    let mut out = [0u32; 4 * KIB / crc::LINE];
    let mut f_ours = || {
        crc::crc32c_lines(keep(&page), &mut out);
        keep(&out);
    };
    let mut f_isal = || {
        for line in keep(&page).chunks_exact(crc::LINE) {
            keep(isal.crc32c(Kernel::Dispatch, line));
        }
    };
    let (ns, ans) = compare(opts, &mut f_ours, Some(&mut f_isal));
    emit(Row::latency("crc32c of each 64B line of 4KiB".into(), ns, "isa-l crc32c a line at a time", ans));
}

/// The ISA-L builds the rows are measured against, by name.
pub fn isal_builds() -> Vec<&'static str> {
    Isal::all().iter().map(|i| i.name()).collect()
}
