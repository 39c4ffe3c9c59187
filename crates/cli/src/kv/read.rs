//! The commands that only read: `get`, `scan`, `count`, `dump`. Each holds the pool beside
//! other readers and reads every node and value through the checks (rebuilding a damaged
//! page in its own copy) before it prints anything from it.

use std::io::{IsTerminal, Write};
use std::path::Path;

use bitmend_heap::kv::Kv;
use bitmend_heap::{PoolOptions, ReadCheck};
use clap::Args;

use super::opened::{Access, Opened};
use super::Session;
use crate::error::CliError;
use crate::json::json_str;

/// Which keys: those with a prefix, those from one key up to another, or both at once
/// (the keys in both).
#[derive(Args, Debug, Default, Clone)]
pub struct Range {
    /// Keys that start with this.
    #[arg(long)]
    pub prefix: Option<String>,
    /// Keys from this one on, itself included.
    #[arg(long)]
    pub from: Option<String>,
    /// Keys before this one.
    #[arg(long)]
    pub to: Option<String>,
}

/// A [`Range`]'s bounds as bytes.
struct Bounds {
    prefix: Vec<u8>,
    from: Option<Vec<u8>>,
    to: Option<Vec<u8>>,
}

impl Range {
    pub fn is_empty(&self) -> bool {
        self.prefix.is_none() && self.from.is_none() && self.to.is_none()
    }

    fn bounds(&self, s: Session) -> Result<Bounds, CliError> {
        let parse = |v: &Option<String>, what| v.as_deref().map(|v| s.form.parse(v, what)).transpose();
        let b = Bounds {
            prefix: parse(&self.prefix, "--prefix").map_err(CliError::Usage)?.unwrap_or_default(),
            from: parse(&self.from, "--from").map_err(CliError::Usage)?,
            to: parse(&self.to, "--to").map_err(CliError::Usage)?,
        };
        Ok(b)
    }

    /// Every entry in the range, in key order, checked, until `f` returns false.
    pub fn walk(
        &self,
        s: Session,
        (pool, kv): (&mut Opened, &Kv),
        f: &mut dyn FnMut(&[u8], Vec<u8>) -> bool,
    ) -> Result<(), CliError> {
        let b = self.bounds(s)?;
        // The later start: the prefix itself, or --from past it.
        let start = match b.from {
            Some(f) if f > b.prefix => f,
            _ => b.prefix.clone(),
        };
        let start = (!start.is_empty()).then_some(start);
        kv.scan_healing(pool, start.as_deref(), b.to.as_deref(), &mut |k, v| {
            k.starts_with(&b.prefix) && f(k, v)
        })?;
        Ok(())
    }
}

/// The pool in `file`, held beside other readers, every read checked.
pub(super) fn open_reader(s: Session, file: &Path) -> Result<(Opened, Kv), CliError> {
    let (mut pool, _, kv) = Opened::open(file, PoolOptions::default(), Access::Read, s.wait)?;
    pool.set_read_check(ReadCheck::Every);
    Ok((pool, kv))
}

/// A failed write to standard output: a closed pipe ends the command quietly (as `head`
/// closing it asks), anything else is an error.
fn written(r: std::io::Result<()>) -> Result<bool, CliError> {
    match r {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(CliError::Failed(format!("standard output: {e}"))),
    }
}

pub fn get(s: Session, file: &Path, key: &[u8], raw: bool, json: bool) -> Result<(), CliError> {
    let (mut pool, kv) = open_reader(s, file)?;
    let Some(v) = kv.get_healing(&mut pool, key)? else {
        return Err(CliError::Failed(format!("no key {}", s.form.shown(key))));
    };
    let mut out = std::io::stdout().lock();
    let r = if json {
        writeln!(out, "{{{}, {}}}", s.form.json("key", key), s.form.json("value", &v))
    } else if s.form == super::Form::Hex {
        writeln!(out, "{}", super::bytes::to_hex(&v))
    } else {
        // The value's bytes exactly; a newline after them only for a person.
        out.write_all(&v).and_then(|()| if out.is_terminal() && !raw { writeln!(out) } else { Ok(()) })
    };
    written(r).map(|_| ())
}

pub fn scan(
    s: Session,
    file: &Path,
    range: &Range,
    limit: Option<usize>,
    json: bool,
) -> Result<(), CliError> {
    let (mut pool, kv) = open_reader(s, file)?;
    let limit = limit.unwrap_or(usize::MAX);
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let (mut n, mut failed) = (0usize, None);
    range.walk(s, (&mut pool, &kv), &mut |k, v| {
        if n >= limit {
            return false;
        }
        let line = if json {
            Ok(format!("{{{}, {}}}", s.form.json("key", k), s.form.json("value", &v)))
        } else {
            s.form.line(k, &v)
        };
        let r = line.and_then(|l| written(writeln!(out, "{l}")));
        n += 1;
        match r {
            Ok(more) => more && n < limit,
            Err(e) => {
                failed = Some(e);
                false
            }
        }
    })?;
    let flushed = written(out.flush());
    failed.map_or(flushed.map(|_| ()), Err)
}

pub fn count(s: Session, file: &Path, range: &Range, json: bool) -> Result<(), CliError> {
    let (mut pool, kv) = open_reader(s, file)?;
    let mut n = 0u64;
    range.walk(s, (&mut pool, &kv), &mut |_, _| {
        n += 1;
        true
    })?;
    let line = if json {
        format!("{{\"file\": {}, \"entries\": {n}}}", json_str(&file.display().to_string()))
    } else {
        n.to_string()
    };
    written(writeln!(std::io::stdout().lock(), "{line}")).map(|_| ())
}
