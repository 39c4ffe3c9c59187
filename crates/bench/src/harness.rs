//! Timing, rows and output.

use std::hint::black_box;
use std::time::{Duration, Instant};

/// How hard to measure.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Samples per figure (the median is reported).
    pub samples: usize,
    /// Wall time per sample.
    pub sample_time: Duration,
    /// Fewer cases, for smoke tests.
    pub quick: bool,
}

impl Options {
    /// The full run.
    pub fn full() -> Self {
        Options { samples: 9, sample_time: Duration::from_millis(40), quick: false }
    }

    /// Under a minute.
    pub fn quick() -> Self {
        Options { samples: 3, sample_time: Duration::from_millis(10), quick: true }
    }
}

/// Whether a larger figure is better (throughput) or a smaller one (time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Better {
    Higher,
    Lower,
    /// Figures shown side by side that no ratio summarizes (a histogram's buckets).
    Neither,
}

/// One line of a benchmark report.
#[derive(Clone, Debug)]
pub struct Row {
    pub bench: &'static str,
    pub case: String,
    pub ours: f64,
    pub anchor: String,
    pub anchor_value: Option<f64>,
    pub unit: &'static str,
    pub better: Better,
}

impl Row {
    /// A throughput row: `bytes` moved per call, nanoseconds per call for us and the anchor.
    pub fn throughput(case: String, bytes: usize, ns: f64, anchor: &str, anchor_ns: Option<f64>) -> Row {
        Row {
            bench: "code",
            case,
            ours: gbps(bytes, ns),
            anchor: anchor.into(),
            anchor_value: anchor_ns.map(|a| gbps(bytes, a)),
            unit: "GB/s",
            better: Better::Higher,
        }
    }

    /// A latency row: nanoseconds per call for us and the anchor.
    pub fn latency(case: String, ns: f64, anchor: &str, anchor_ns: Option<f64>) -> Row {
        Row {
            bench: "code",
            case,
            ours: ns,
            anchor: anchor.into(),
            anchor_value: anchor_ns,
            unit: "ns",
            better: Better::Lower,
        }
    }

    /// A count where fewer is better (writes, lines), for us and the anchor.
    pub fn count(case: &str, ours: f64, anchor: &str, anchor_value: Option<f64>) -> Row {
        Row { unit: "count", ..Row::latency(case.into(), ours, anchor, anchor_value) }
    }

    /// Two figures side by side, without a ratio.
    pub fn shown(
        case: String,
        ours: f64,
        anchor: &str,
        anchor_value: Option<f64>,
        unit: &'static str,
    ) -> Row {
        Row { unit, better: Better::Neither, ..Row::latency(case, ours, anchor, anchor_value) }
    }

    /// The same row, filed under another `bitmend bench` suite.
    pub fn in_bench(mut self, bench: &'static str) -> Row {
        self.bench = bench;
        self
    }

    /// Above 1 always means bitmend is better; none when there is no anchor or either side
    /// is zero (a ratio to nothing, which JSON could not carry either).
    pub fn ratio(&self) -> Option<f64> {
        let a = self.anchor_value?;
        let r = match self.better {
            Better::Higher => self.ours / a,
            Better::Lower => a / self.ours,
            Better::Neither => return None,
        };
        (r.is_finite() && r > 0.0).then_some(r)
    }

    /// One JSON object, on one line.
    pub fn to_json(&self) -> String {
        let num =
            |v: Option<f64>| v.filter(|v| v.is_finite()).map_or("null".to_string(), |v| format!("{:.4}", v));
        format!(
            "{{\"bench\": {}, \"case\": {}, \"ours\": {}, \"anchor\": {}, \"anchor_value\": {}, \"unit\": {}, \"ratio\": {}}}",
            json_str(self.bench),
            json_str(&self.case),
            num(Some(self.ours)),
            json_str(&self.anchor),
            num(self.anchor_value),
            json_str(self.unit),
            num(self.ratio()),
        )
    }
}

/// A JSON string literal for `s`.
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

/// A readable table of rows.
pub fn table(rows: &[Row]) -> String {
    let w = rows.iter().map(|r| r.case.len()).max().unwrap_or(4).max(4);
    let aw = rows.iter().map(|r| r.anchor.len()).max().unwrap_or(6).max(6);
    let mut s = format!(
        "{:<w$}  {:>10}  {:<aw$}  {:>10}  {:<5}  {:>7}\n",
        "case", "ours", "anchor", "anchor", "unit", "ratio"
    );
    for r in rows {
        let a = r.anchor_value.map_or("-".to_string(), fmt_num);
        let ratio = r.ratio().map_or("-".to_string(), |x| format!("{x:.2}x"));
        s += &format!(
            "{:<w$}  {:>10}  {:<aw$}  {:>10}  {:<5}  {:>7}\n",
            r.case,
            fmt_num(r.ours),
            r.anchor,
            a,
            r.unit,
            ratio
        );
    }
    s
}

fn fmt_num(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// Nanoseconds per call of `f`: iterations calibrated to fill one sample.
fn sample(f: &mut dyn FnMut(), time: Duration, iters: &mut u64) -> f64 {
    if *iters == 0 {
        let mut n = 1u64;
        loop {
            let t = Instant::now();
            for _ in 0..n {
                f();
            }
            let e = t.elapsed();
            if e >= time / 4 || n >= 1 << 30 {
                let per = e.as_secs_f64() / n as f64;
                *iters = ((time.as_secs_f64() / per.max(1e-10)) as u64).max(1);
                break;
            }
            n *= 4;
        }
    }
    let t = Instant::now();
    for _ in 0..*iters {
        f();
    }
    t.elapsed().as_secs_f64() * 1e9 / *iters as f64
}

/// Median nanoseconds per call of `ours` and of `anchor` (if any), samples interleaved.
pub fn compare(
    opts: &Options,
    ours: &mut dyn FnMut(),
    mut anchor: Option<&mut dyn FnMut()>,
) -> (f64, Option<f64>) {
    let (mut a, mut b) = (Vec::new(), Vec::new());
    let (mut ia, mut ib) = (0u64, 0u64);
    for _ in 0..opts.samples {
        a.push(sample(ours, opts.sample_time, &mut ia));
        if let Some(f) = anchor.as_deref_mut() {
            b.push(sample(f, opts.sample_time, &mut ib));
        }
    }
    (median(&mut a), (!b.is_empty()).then(|| median(&mut b)))
}

/// The median of `v` (sorted in place).
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|x, y| x.total_cmp(y));
    v[v.len() / 2]
}

/// A file at `path` (replaced if there) mapped as a persistent region that flushes cache
/// lines, every page and wear counter touched so that no timing pays a first-touch fault.
pub fn shm_region(path: &std::path::Path, len: usize, lines: LineCounts) -> bitmend_media::pmem::MmapRegion {
    use bitmend_media::pmem::{MmapRegion, Persistence};
    let _ = std::fs::remove_file(path);
    let mut r = MmapRegion::create(path, len)
        .expect("a region on /dev/shm")
        .with_persistence(Persistence::CacheLineFlush);
    if lines == LineCounts::Counted {
        r = r.with_line_counts();
    }
    r.prefault();
    r
}

/// Whether a region counts its stores per line. Counting costs a counter line touched per
/// line stored, so timed runs do not count, on either side: the counts come from runs of
/// their own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LineCounts {
    Timed,
    Counted,
}

/// GB/s from bytes per call and nanoseconds per call.
pub fn gbps(bytes: usize, ns: f64) -> f64 {
    bytes as f64 / ns
}

/// Keeps the optimizer from discarding a result.
pub fn keep<T>(v: T) -> T {
    black_box(v)
}

/// A row of `bench flashfs` (its page store, file system and scale rows alike).
pub(crate) fn flashfs_row(
    case: String,
    ours: f64,
    anchor: &str,
    anchor_value: f64,
    unit: &'static str,
    better: Better,
) -> Row {
    Row {
        bench: "flashfs",
        case,
        ours,
        anchor: anchor.into(),
        anchor_value: Some(anchor_value),
        unit,
        better,
    }
}
