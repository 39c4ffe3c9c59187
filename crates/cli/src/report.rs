//! The scrub reports as the control file and `--json` write them, and as `bitmend scrub`
//! reads them back: one field table per report, used by the encoder and the parser alike, so
//! that the two cannot drift apart (a round-trip test below holds them to it).

use bitmend_flashfs::{Health, QuickScrubReport, ScrubReport, SigCheck};

use crate::json::{field, number};

/// A counter of a report, by name.
type Counter<R> = (&'static str, fn(&mut R) -> &mut u64);

/// A full pass's counters, in the order they are written (then `done`).
const SCRUB_FIELDS: [Counter<ScrubReport>; 11] = [
    ("segments_total", |r| &mut r.segments_total),
    ("segments_done", |r| &mut r.segments_done),
    ("pages_checked", |r| &mut r.pages_checked),
    ("repaired_by_group", |r| &mut r.repaired_by_group),
    ("repaired_by_segment", |r| &mut r.repaired_by_segment),
    ("unreadable_pages", |r| &mut r.unreadable_pages),
    ("parity_damaged", |r| &mut r.parity_damaged),
    ("logical_pages_relocated", |r| &mut r.logical_pages_relocated),
    ("segments_healed", |r| &mut r.segments_healed),
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
         {} beyond repair; {} damaged parity pages; {} logical pages rewritten; \
         {} segments rewritten under fresh parity; {} of {} damaged superblock copies rewritten",
        r.segments_done,
        r.pages_checked,
        r.repaired_by_group,
        r.repaired_by_segment,
        r.unreadable_pages,
        r.parity_damaged,
        r.logical_pages_relocated,
        r.segments_healed,
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
    format!(
        "\"lifetime_repaired_by_group\": {}, \"lifetime_repaired_by_segment\": {}, \"lifetime_relocated\": {}, \
         \"lifetime_unrecoverable\": {}, \"lifetime_scrub_passes\": {}, \"lifetime_pages_scrubbed\": {}, \
         \"lifetime_program_failures\": {}, \"lifetime_erase_failures\": {}",
        h.repaired_by_group,
        h.repaired_by_segment,
        h.relocated,
        h.unrecoverable,
        h.scrub_passes,
        h.pages_scrubbed,
        h.program_failures,
        h.erase_failures
    )
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
    fn every_field_of_the_reports_is_in_its_table() {
        // A field added to a report without a table entry would not be written: the tables
        // must cover the structs (ScrubReport: 11 counters and `done`; the quick pass: 9).
        assert_eq!(std::mem::size_of::<ScrubReport>(), (SCRUB_FIELDS.len() + 1) * 8);
        assert_eq!(std::mem::size_of::<Quick>(), QUICK_FIELDS.len() * 8);
    }
}
