//! The scrub reports as the control file and `--json` write them, and as `bitmend scrub`
//! reads them back: one field table per report, used by the encoder and the parser alike, so
//! that the two cannot drift apart (a round-trip test below holds them to it).

use bitmend_flashfs::{Health, QuickScrubReport, ScrubReport, SigCheck};

use crate::json::{field, number};

/// A counter of a report, by name.
type Counter<R> = (&'static str, fn(&mut R) -> &mut u64);

/// A full pass's counters, in the order they are written (then `done`).
const SCRUB_FIELDS: [Counter<ScrubReport>; 13] = [
    ("segments_total", |r| &mut r.segments_total),
    ("segments_done", |r| &mut r.segments_done),
    ("pages_checked", |r| &mut r.pages_checked),
    ("repaired_by_group", |r| &mut r.repaired_by_group),
    ("repaired_by_segment", |r| &mut r.repaired_by_segment),
    ("unreadable_pages", |r| &mut r.unreadable_pages),
    ("parity_damaged", |r| &mut r.parity_damaged),
    ("unsigned_damaged", |r| &mut r.unsigned_damaged),
    ("logical_pages_relocated", |r| &mut r.logical_pages_relocated),
    ("segments_healed", |r| &mut r.segments_healed),
    ("segments_refused", |r| &mut r.segments_refused),
    ("superblocks_damaged", |r| &mut r.superblocks_damaged),
    ("superblocks_rewritten", |r| &mut r.superblocks_rewritten),
];

/// The quick pass's counters (the mismatched segments are written as their count).
const QUICK_FIELDS: [Counter<Quick>; 9] = [
    ("segments_checked", |q| &mut q.segments_checked),
    ("spares_read", |q| &mut q.sig.spares_read),
    ("groups_checked", |q| &mut q.sig.groups_checked),
    ("groups_mismatched", |q| &mut q.sig.groups_mismatched),
    ("stripes_checked", |q| &mut q.sig.stripes_checked),
    ("stripes_mismatched", |q| &mut q.sig.stripes_mismatched),
    ("unverifiable", |q| &mut q.sig.unverifiable),
    ("segments_mismatched", |q| &mut q.segments_mismatched),
    ("segments_healed", |q| &mut q.segments_healed),
];

/// The lifetime counters, written `lifetime_…`.
const HEALTH_FIELDS: [Counter<Health>; 8] = [
    ("repaired_by_group", |h| &mut h.repaired_by_group),
    ("repaired_by_segment", |h| &mut h.repaired_by_segment),
    ("relocated", |h| &mut h.relocated),
    ("unrecoverable", |h| &mut h.unrecoverable),
    ("scrub_passes", |h| &mut h.scrub_passes),
    ("pages_scrubbed", |h| &mut h.pages_scrubbed),
    ("program_failures", |h| &mut h.program_failures),
    ("erase_failures", |h| &mut h.erase_failures),
];

/// Space, files and the index, as `bitmend stat` shows them for an image and, through the
/// control file, for a mounted file system.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Space {
    pub bytes_total: u64,
    pub bytes_free: u64,
    pub inodes: u64,
    pub file_data_bytes: u64,
    pub stored_bytes: u64,
    pub segments: u64,
    pub segments_used: u64,
    pub index_chunks: u64,
}

impl Space {
    pub fn of<N: bitmend_media::nand::Nand>(fs: &bitmend_flashfs::Fs<N>) -> Space {
        let (bytes_total, bytes_free) = fs.statfs();
        let (file_data_bytes, stored_bytes) = fs.data_space();
        Space {
            bytes_total,
            bytes_free,
            inodes: fs.inode_count() as u64,
            file_data_bytes,
            stored_bytes,
            segments: fs.store().segments() as u64,
            segments_used: fs.store().used_segments().len() as u64,
            index_chunks: fs.index_chunk_count() as u64,
        }
    }
}

const SPACE_FIELDS: [Counter<Space>; 8] = [
    ("bytes_total", |s| &mut s.bytes_total),
    ("bytes_free", |s| &mut s.bytes_free),
    ("inodes", |s| &mut s.inodes),
    ("file_data_bytes", |s| &mut s.file_data_bytes),
    ("stored_bytes", |s| &mut s.stored_bytes),
    ("segments", |s| &mut s.segments),
    ("segments_used", |s| &mut s.segments_used),
    ("index_chunks", |s| &mut s.index_chunks),
];

/// Space as JSON fields (no braces).
pub fn space_json(s: &Space) -> String {
    encode(s, &SPACE_FIELDS, "").join(", ")
}

/// What [`space_json`] wrote, read back.
pub fn space_from_json(status: &str) -> Result<Space, String> {
    decode(status, &SPACE_FIELDS, "")
}

/// What [`health_json`] wrote, read back.
pub fn health_from_json(status: &str) -> Result<Health, String> {
    decode(status, &HEALTH_FIELDS, "lifetime_")
}

/// A quick pass as the control file carries it: [`QuickScrubReport`] with the mismatched
/// segments counted, not listed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Quick {
    pub segments_checked: u64,
    pub sig: SigCheck,
    pub segments_mismatched: u64,
    pub segments_healed: u64,
}

impl From<&QuickScrubReport> for Quick {
    fn from(r: &QuickScrubReport) -> Quick {
        Quick {
            segments_checked: r.segments_checked,
            sig: r.signatures,
            segments_mismatched: r.segments_mismatched.len() as u64,
            segments_healed: r.segments_healed,
        }
    }
}

fn encode<R: Copy>(r: &R, fields: &[Counter<R>], prefix: &str) -> Vec<String> {
    let mut r = *r;
    fields.iter().map(|(k, f)| format!("\"{prefix}{k}\": {}", *f(&mut r))).collect()
}

fn decode<R: Default>(status: &str, fields: &[Counter<R>], prefix: &str) -> Result<R, String> {
    let mut r = R::default();
    for (k, f) in fields {
        *f(&mut r) = number(status, &format!("{prefix}{k}"))?;
    }
    Ok(r)
}

/// A full pass's report as JSON fields (no braces).
pub fn report_json(r: &ScrubReport) -> String {
    let mut out = encode(r, &SCRUB_FIELDS, "");
    out.push(format!("\"done\": {}", r.done));
    out.join(", ")
}

/// What [`report_json`] wrote, read back from a line of JSON.
pub fn report_from_json(status: &str) -> Result<ScrubReport, String> {
    let mut r: ScrubReport = decode(status, &SCRUB_FIELDS, "")?;
    r.done = field(status, "done") == Some("true");
    Ok(r)
}

/// A quick pass's report as JSON fields (no braces), each name after `prefix` (the control
/// file writes them beside the full pass's as `quick_…`).
pub fn quick_json(q: &Quick, prefix: &str) -> String {
    encode(q, &QUICK_FIELDS, prefix).join(", ")
}

/// What [`quick_json`] wrote, read back.
pub fn quick_from_json(status: &str, prefix: &str) -> Result<Quick, String> {
    decode(status, &QUICK_FIELDS, prefix)
}

/// A full pass's report in one line of text, for the daemon's log and `bitmend scrub`.
pub fn report_text(r: &ScrubReport) -> String {
    format!(
        "{} segments, {} pages checked; repaired {} from group parity, {} from segment parity; \
         {} beyond repair; {} damaged parity pages; {} damaged pages without a spare; \
         {} logical pages rewritten; \
         {} segments rewritten under fresh parity; {} segments left as they were (their data \
         could not be shown moved); {} of {} damaged superblock copies rewritten",
        r.segments_done,
        r.pages_checked,
        r.repaired_by_group,
        r.repaired_by_segment,
        r.unreadable_pages,
        r.parity_damaged,
        r.unsigned_damaged,
        r.logical_pages_relocated,
        r.segments_healed,
        r.segments_refused,
        r.superblocks_rewritten,
        r.superblocks_damaged
    )
}

/// A quick pass's report in one line of text.
pub fn quick_text(q: &Quick) -> String {
    format!(
        "quick pass: {} segments, {} spares read (no data area); {} groups and {} stripes checked \
         against their parity, {} and {} disagreed; {} segments with parity that disagreed, {} \
         rewritten under fresh parity; {} left to the full pass (a spare that does not decode)",
        q.segments_checked,
        q.sig.spares_read,
        q.sig.groups_checked,
        q.sig.stripes_checked,
        q.sig.groups_mismatched,
        q.sig.stripes_mismatched,
        q.segments_mismatched,
        q.segments_healed,
        q.sig.unverifiable
    )
}

/// The lifetime counters as JSON fields (no braces).
pub fn health_json(h: &Health) -> String {
    encode(h, &HEALTH_FIELDS, "lifetime_").join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_pass_report_reads_back_as_written() {
        // Distinct values, so that two fields swapped in the table or the parser show.
        let mut r = ScrubReport { done: true, ..ScrubReport::default() };
        for (i, (_, f)) in SCRUB_FIELDS.iter().enumerate() {
            *f(&mut r) = 1000 + i as u64;
        }
        let line = format!("{{\"state\": \"idle\", {}, \"error\": null}}", report_json(&r));
        assert_eq!(report_from_json(&line).unwrap(), r);
        assert!(!report_from_json(&line.replace("true", "false")).unwrap().done);
        assert!(report_from_json("{\"state\": \"idle\"}").is_err(), "a missing field is an error");
    }

    #[test]
    fn a_quick_report_reads_back_as_written_beside_a_full_one() {
        let mut q = Quick::default();
        for (i, (_, f)) in QUICK_FIELDS.iter().enumerate() {
            *f(&mut q) = 7 + 3 * i as u64;
        }
        let full = ScrubReport { segments_healed: 99, ..ScrubReport::default() };
        let line = format!("{{{}, {}}}", report_json(&full), quick_json(&q, "quick_"));
        assert_eq!(quick_from_json(&line, "quick_").unwrap(), q);
        assert_eq!(report_from_json(&line).unwrap(), full, "the prefix keeps the two apart");
    }

    #[test]
    fn space_and_health_read_back_beside_each_other() {
        let mut space = Space::default();
        for (i, (_, f)) in SPACE_FIELDS.iter().enumerate() {
            *f(&mut space) = 1 << (i + 20);
        }
        let mut health = Health::default();
        for (i, (_, f)) in HEALTH_FIELDS.iter().enumerate() {
            *f(&mut health) = 500 + i as u64;
        }
        let line = format!("{{\"state\": \"idle\", {}, {}}}", health_json(&health), space_json(&space));
        assert_eq!(space_from_json(&line).unwrap(), space);
        assert_eq!(health_from_json(&line).unwrap(), health);
    }

    #[test]
    fn every_field_of_the_reports_is_in_its_table() {
        // A field added to a report without a table entry would not be written: the tables
        // must cover the structs (ScrubReport: 11 counters and `done`; the quick pass: 9).
        assert_eq!(std::mem::size_of::<ScrubReport>(), (SCRUB_FIELDS.len() + 1) * 8);
        assert_eq!(std::mem::size_of::<Quick>(), QUICK_FIELDS.len() * 8);
        assert_eq!(std::mem::size_of::<Space>(), SPACE_FIELDS.len() * 8);
        assert_eq!(std::mem::size_of::<Health>(), HEALTH_FIELDS.len() * 8);
    }
}
