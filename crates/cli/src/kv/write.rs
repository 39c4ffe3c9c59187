//! The commands that write: `create`, `put`, `del`, `load`. Each holds the pool alone,
//! waiting for readers and writers up to `--wait`.

use std::io::{BufRead, IsTerminal};
use std::path::{Path, PathBuf};

use bitmend_heap::kv::Kv;
use bitmend_heap::{HeapError, Pool, PoolOptions, StripeShape};
use bitmend_media::pmem::{MmapRegion, Region};

use super::bytes::Form;
use super::opened::{Access, Opened};
use super::{given_key, read_input, Range, Session};
use crate::error::CliError;
use crate::json::json_str;

/// Keys a range delete or a load puts in one transaction.
const BATCH: usize = 1000;

fn open_writer(s: Session, file: &Path) -> Result<(Opened, Kv), CliError> {
    let (pool, _, kv) = Opened::open(file, PoolOptions::default(), Access::Write, s.wait)?;
    Ok((pool, kv))
}

fn file_json(file: &Path) -> String {
    format!("\"file\": {}", json_str(&file.display().to_string()))
}

pub fn create(file: &Path, size: u64, stripes: Option<StripeShape>, json: bool) -> Result<(), CliError> {
    let region = MmapRegion::create(file, size as usize).map_err(|e| CliError::Target(e.to_string()))?;
    let made = Pool::create(region, PoolOptions { stripes, ..PoolOptions::default() })
        .and_then(|mut pool| Kv::create(&mut pool).map(|_| pool));
    // A create that fails leaves no file behind (it made the file).
    made.inspect_err(|_| {
        let _ = std::fs::remove_file(file);
    })?
    .close();
    if json {
        let shape = stripes.map_or("null".into(), |s| format!("\"{}+{}\"", s.k, s.m));
        println!("{{{}, \"size\": {size}, \"stripes\": {shape}}}", file_json(file));
    } else {
        let heals = stripes.map_or(String::new(), |s| format!(", healing in stripes of {}+{}", s.k, s.m));
        println!(
            "{}: a key-value store in a pool of {}{heals}",
            file.display(),
            crate::units::show_size(size)
        );
    }
    Ok(())
}

/// The key and value of a `put`: KEY or --key-file (then a lone argument is the value),
/// VALUE or --value-file.
pub fn key_and_value(
    form: Form,
    (key, key_file): (Option<String>, Option<PathBuf>),
    (value, value_file): (Option<String>, Option<PathBuf>),
) -> Result<(Vec<u8>, Vec<u8>), CliError> {
    let (key, value) = match (key_file.is_some(), key, value) {
        (true, Some(v), None) => (None, Some(v)),
        (true, Some(_), Some(_)) => return Err(CliError::Usage("--key-file takes the place of KEY".into())),
        (_, k, v) => (k, v),
    };
    let key = given_key(form, key, key_file)?;
    let value = match (value, value_file) {
        (Some(v), None) => form.parse(&v, "value").map_err(CliError::Usage)?,
        (None, Some(f)) => read_input(&f)?,
        _ => return Err(CliError::Usage("give a VALUE or --value-file".into())),
    };
    Ok((key, value))
}

pub fn put(s: Session, file: &Path, key: &[u8], value: &[u8], json: bool) -> Result<(), CliError> {
    let (mut pool, kv) = open_writer(s, file)?;
    kv.put(&mut pool, key, value)?;
    if json {
        println!("{{{}, {}, \"value_bytes\": {}}}", file_json(file), s.form.json("key", key), value.len());
    }
    Ok(())
}

pub fn del(s: Session, file: &Path, key: &[u8], json: bool) -> Result<(), CliError> {
    let (mut pool, kv) = open_writer(s, file)?;
    if !kv.delete(&mut pool, key)? {
        return Err(CliError::Failed(format!("no key {}", s.form.shown(key))));
    }
    if json {
        println!("{{{}, \"deleted\": 1}}", file_json(file));
    }
    Ok(())
}

/// Deletes every key in `range`, [`BATCH`] keys a transaction: the keys of a batch read
/// (checked) first, then deleted together.
pub fn del_range(s: Session, file: &Path, range: &Range, json: bool) -> Result<(), CliError> {
    let (mut pool, kv) = open_writer(s, file)?;
    let mut deleted = 0u64;
    loop {
        let mut keys = Vec::with_capacity(BATCH);
        range.walk(s, (&mut pool, &kv), &mut |k, _| {
            keys.push(k.to_vec());
            keys.len() < BATCH
        })?;
        if keys.is_empty() {
            break;
        }
        kv.batch(&mut pool, |kv, tx| keys.iter().try_for_each(|k| kv.delete_in(tx, k).map(|_| ())))?;
        deleted += keys.len() as u64;
    }
    if json {
        println!("{{{}, \"deleted\": {deleted}}}", file_json(file));
    } else {
        println!("{}: {deleted} keys deleted", file.display());
    }
    Ok(())
}

pub fn load(s: Session, file: &Path, input: &Path, json: bool) -> Result<(), CliError> {
    let (mut pool, kv) = open_writer(s, file)?;
    let stdin = input == Path::new("-");
    let (reader, total): (Box<dyn BufRead>, u64) = if stdin {
        (Box::new(std::io::stdin().lock()), 0)
    } else {
        let f =
            std::fs::File::open(input).map_err(|e| CliError::Usage(format!("{}: {e}", input.display())))?;
        let total = f.metadata().map(|m| m.len()).unwrap_or(0);
        (Box::new(std::io::BufReader::new(f)), total)
    };
    let tty = std::io::stderr().is_terminal() && total > 0 && !json;
    let mut lines = reader.lines().enumerate();
    let (mut done_bytes, mut entries) = (0u64, 0u64);
    // A bad line stops the load: what was committed before its batch stays, and is said.
    let bad = |n: usize, why: &str, entries: u64| {
        CliError::Usage(format!(
            "{}: line {}: {why}; {entries} entries were loaded before the batch of up to 1,000 lines that holds it, which was not",
            input.display(),
            n + 1
        ))
    };
    loop {
        let mut batch = Vec::with_capacity(BATCH);
        for (n, line) in lines.by_ref().take(BATCH) {
            let line = match line {
                Ok(line) => line,
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                    return Err(bad(n, "not UTF-8 text (--hex takes any bytes)", entries));
                }
                Err(e) => return Err(CliError::Failed(format!("{}: {e}", input.display()))),
            };
            done_bytes += line.len() as u64 + 1;
            let Some((k, v)) = line.split_once('\t') else {
                return Err(bad(n, "no tab between key and value", entries));
            };
            let k = s.form.parse(k, "key").map_err(|why| bad(n, &why, entries))?;
            let v = s.form.parse(v, "value").map_err(|why| bad(n, &why, entries))?;
            batch.push((k, v));
        }
        if batch.is_empty() {
            break;
        }
        put_all(&mut pool, &kv, &batch)?;
        entries += batch.len() as u64;
        if tty {
            let pct = (done_bytes * 100 / total.max(1)).min(100);
            eprint!("\rload: [{:<25}] {pct}%, {entries} entries", "#".repeat(pct as usize / 4));
        }
    }
    if tty {
        eprintln!();
    }
    let held = kv.len(&pool)?;
    if json {
        println!("{{{}, \"loaded\": {entries}, \"entries\": {held}}}", file_json(file));
    } else {
        println!("{}: {entries} entries loaded; the store holds {held}", file.display());
    }
    Ok(())
}

/// Puts `batch` in one transaction, or, when its records do not fit in the pool's journal, in
/// halves (each all or nothing), down to one entry per transaction.
fn put_all<R: Region>(pool: &mut Pool<R>, kv: &Kv, batch: &[(Vec<u8>, Vec<u8>)]) -> Result<(), HeapError> {
    let r = kv.batch(pool, |kv, tx| batch.iter().try_for_each(|(k, v)| kv.put_in(tx, k, v)));
    match r {
        Err(HeapError::JournalFull { .. }) if batch.len() > 1 => {
            let (a, b) = batch.split_at(batch.len() / 2);
            put_all(pool, kv, a)?;
            put_all(pool, kv, b)
        }
        r => r,
    }
}
