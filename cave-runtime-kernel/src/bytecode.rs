//! The worker's own code compiled once per interpreter and kept on disk, so that a worker
//! starts from code objects instead of compiling its 110 KB of Python source every time
//! (about 17 ms of each start, on the 2-core development VM).
//!
//! On a miss (the first start with an interpreter on this machine) the host runs the
//! interpreter once, isolated (`-I -S`), to compile the sources, while the worker it just
//! started is still starting, and writes the result; that worker, and every later one of this
//! process or of a later one, takes it. Only the host writes the cache, never a worker (whose
//! cells are the model's): a cell cannot plant code in a later session. The worker uses a
//! cached module only if the interpreter's magic number (the bytecode format) matches its own,
//! and compiles the source otherwise. The directory and its files must be the user's and not
//! writable by anyone else, or the cache is not read.

use crate::marshal::{self, Data};
use cave_core::Value;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// The start of every cache file (the format's version is its last byte), followed by the
/// key (16 bytes), a checksum of the rest (16 bytes), and the compiler's output.
const HEADER: &[u8; 8] = b"CAVEPYC1";

/// A cache file larger than this is not read (the worker's code is under 1 MiB compiled).
const MAX_FILE: u64 = 16 << 20;

/// How long the compiling interpreter may take before it is killed (it takes about 50 ms).
const COMPILE_TIMEOUT: Duration = Duration::from_secs(20);

/// Compiles the modules it reads on stdin (a marshalled list of `(name, filename, source)`)
/// and writes `(magic, [(name, marshalled code)])`, marshalled in version 2 (no references:
/// the host's decoder reads that), to stdout. Flags and optimisation as the bootstrap's own
/// `compile` has them.
const COMPILER: &str = "\
import marshal, sys
from importlib.util import MAGIC_NUMBER
modules = marshal.loads(sys.stdin.buffer.read())
out = [(name, marshal.dumps(compile(source, filename, 'exec'))) for name, filename, source in modules]
sys.stdout.buffer.write(marshal.dumps((MAGIC_NUMBER, out), 2))
";

/// The worker's modules compiled by one interpreter.
#[derive(Debug)]
pub(crate) struct Precompiled {
    /// The interpreter's magic number: the worker takes the code only if it has the same.
    pub(crate) magic: Vec<u8>,
    /// Each module's marshalled code object, by module name.
    pub(crate) modules: HashMap<String, Vec<u8>>,
}

/// What this process knows of an interpreter's compiled code.
enum Known {
    Ready(Arc<Precompiled>),
    /// Could not be read or compiled: not tried again by this process.
    Absent,
}

/// By cache directory and key.
fn known_code() -> &'static Mutex<HashMap<(PathBuf, u128), Known>> {
    static KNOWN: OnceLock<Mutex<HashMap<(PathBuf, u128), Known>>> = OnceLock::new();
    KNOWN.get_or_init(Default::default)
}

/// The default directory: `worker-code` in the cache directory the interpreter's report uses
/// (`$XDG_CACHE_HOME/cave-agent`, else `~/.cache/cave-agent`).
pub(crate) fn default_dir() -> Option<PathBuf> {
    cave_python::report::default_dir().map(|dir| dir.join("worker-code"))
}

/// The worker's code compiled by `python`, from this process's memory, from `dir`, or on a
/// miss compiled now (and written to `dir`); `None` if it cannot be had (the worker then
/// compiles its sources). Blocking: call it off the async threads.
pub(crate) fn precompiled(dir: &Path, python: &Path) -> Option<Arc<Precompiled>> {
    let key = key(python)?;
    let entry = (dir.to_path_buf(), key);
    // One lookup at a time: starts beside a first one wait for its compiling instead of
    // compiling too.
    let mut known = known_code().lock().unwrap_or_else(|p| p.into_inner());
    match known.get(&entry) {
        Some(Known::Ready(code)) => return Some(code.clone()),
        Some(Known::Absent) => return None,
        None => {}
    }
    let file = dir.join(format!("{key:032x}.bin"));
    let found = read(dir, &file, key).or_else(|why| {
        tracing::debug!(file = %file.display(), %why, "no compiled worker code: compiling it");
        compile(dir, &file, python, key)
    });
    match found {
        Ok(code) => {
            let code = Arc::new(code);
            known.insert(entry, Known::Ready(code.clone()));
            Some(code)
        }
        Err(why) => {
            tracing::info!(python = %python.display(), %why, "no compiled worker code: each worker compiles its own");
            known.insert(entry, Known::Absent);
            None
        }
    }
}

/// What names the code: the interpreter (its real path, size and time of change) and the
/// worker's sources, in 128 bits. (The sources' 110 KB are hashed once per process: this runs
/// at every start.)
fn key(python: &Path) -> Option<u128> {
    static SOURCES: OnceLock<u128> = OnceLock::new();
    let sources = *SOURCES.get_or_init(|| hash128(&sources()));
    let real = std::fs::canonicalize(python).ok()?;
    let meta = std::fs::metadata(&real).ok()?;
    Some(hash128(&(real, meta.len(), meta.modified().ok(), sources)))
}

/// 128 bits of `value`'s hash: two differently salted SipHash runs (a cache's names and
/// checksums, where a collision costs a recompilation or a refused file, not safety).
fn hash128(value: &impl Hash) -> u128 {
    let half = |salt: u8| {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        salt.hash(&mut h);
        value.hash(&mut h);
        h.finish()
    };
    (u128::from(half(1)) << 64) | u128::from(half(2))
}

/// The sources frame the bootstrap reads (`child/spawn.rs`): each module
/// `(name, filename, source)`, and `(magic, code)` after them where `precompiled` has it.
pub(crate) fn frame(precompiled: Option<&Precompiled>) -> Value {
    Value::List(
        sources()
            .iter()
            .map(|(name, filename, source)| {
                let mut module = vec![(*name).into(), (*filename).into(), (*source).into()];
                if let Some((magic, code)) =
                    precompiled.and_then(|p| Some((&p.magic, p.modules.get(*name)?)))
                {
                    module.push(Value::Tuple(vec![
                        Value::Bytes(magic.clone()),
                        Value::Bytes(code.clone()),
                    ]));
                }
                Value::Tuple(module)
            })
            .collect(),
    )
}

/// The modules the worker loads: `(name, filename, source)`.
fn sources() -> [(&'static str, &'static str, &'static str); 2] {
    [
        (
            cave_python::EXECUTOR_MODULE,
            cave_python::EXECUTOR_FILE,
            cave_python::EXECUTOR,
        ),
        (
            cave_python::KERNEL_MODULE,
            cave_python::KERNEL_FILE,
            cave_python::KERNEL,
        ),
    ]
}

/// Reads a cache file written by [`compile`], if the directory and the file are the user's
/// alone and it is whole (its checksum matches).
fn read(dir: &Path, file: &Path, key: u128) -> Result<Precompiled, String> {
    private(dir)?;
    let mut opened = std::fs::File::open(file).map_err(|e| e.to_string())?;
    let meta = opened.metadata().map_err(|e| e.to_string())?;
    private_file(&meta)?;
    if meta.len() > MAX_FILE {
        return Err(format!(
            "{} bytes is more than a cache file holds",
            meta.len()
        ));
    }
    let mut bytes = Vec::new();
    opened.read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    let rest = bytes
        .strip_prefix(HEADER.as_slice())
        .and_then(|rest| rest.strip_prefix(key.to_be_bytes().as_slice()))
        .ok_or("not a cache file of this version for this key")?;
    let (checksum, body) = rest.split_at_checked(16).ok_or("cut short")?;
    if checksum != hash128(&body).to_be_bytes() {
        return Err("damaged: its checksum does not match".to_owned());
    }
    parse(body)
}

/// The compiler's output: `(magic, [(name, code)])`, every module of [`sources`] present.
fn parse(body: &[u8]) -> Result<Precompiled, String> {
    let (value, _) = marshal::decode(body).map_err(|e| e.to_string())?;
    let Value::Tuple(items) = value else {
        return Err("not a (magic, modules) pair".to_owned());
    };
    let [Value::Bytes(magic), Value::List(list)] = items.as_slice() else {
        return Err("not a (magic, modules) pair".to_owned());
    };
    let mut modules = HashMap::new();
    for entry in list {
        match entry {
            Value::Tuple(pair) => match pair.as_slice() {
                [Value::Str(name), Value::Bytes(code)] => {
                    modules.insert(name.clone(), code.clone());
                }
                _ => return Err("a module is not a (name, code) pair".to_owned()),
            },
            _ => return Err("a module is not a (name, code) pair".to_owned()),
        }
    }
    if sources()
        .iter()
        .any(|(name, _, _)| !modules.contains_key(*name))
    {
        return Err("a module is missing".to_owned());
    }
    Ok(Precompiled {
        magic: magic.clone(),
        modules,
    })
}

/// Runs `python` to compile the worker's sources, and writes the result to `file` (whole or
/// not at all: written aside, then renamed); the code is used even if it cannot be written.
fn compile(dir: &Path, file: &Path, python: &Path, key: u128) -> Result<Precompiled, String> {
    let mut input = Vec::new();
    marshal::encode(&Data::Owned(frame(None)), &mut input).map_err(|e| e.to_string())?;
    let mut child = Command::new(python)
        .args(["-I", "-S", "-c", COMPILER])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("could not run {}: {e}", python.display()))?;
    let mut stdin = child.stdin.take().ok_or("no stdin")?;
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let reader = std::thread::spawn(move || {
        let mut output = Vec::new();
        stdout
            .take(MAX_FILE)
            .read_to_end(&mut output)
            .map(|_| output)
    });
    // Bounded: a compiler that hangs is killed, so that this thread ends.
    let deadline = std::time::Instant::now() + COMPILE_TIMEOUT;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("the compiler took more than {COMPILE_TIMEOUT:?}"));
            }
            Err(e) => return Err(e.to_string()),
        }
    };
    let output = reader
        .join()
        .map_err(|_| "the compiler's reader panicked".to_owned())?
        .map_err(|e| e.to_string())?;
    let _ = writer.join();
    if !status.success() {
        return Err(format!("the compiler ended with {status}"));
    }
    let precompiled = parse(&output)?;
    if let Err(why) = store(dir, file, key, &output) {
        tracing::info!(file = %file.display(), %why, "could not keep the compiled worker code");
    }
    Ok(precompiled)
}

/// Writes the compiler's `output` as the cache file for `key`.
fn store(dir: &Path, file: &Path, key: u128, output: &[u8]) -> Result<(), String> {
    create_private(dir)?;
    let mut bytes = Vec::with_capacity(HEADER.len() + 32 + output.len());
    bytes.extend_from_slice(HEADER);
    bytes.extend_from_slice(&key.to_be_bytes());
    bytes.extend_from_slice(&hash128(&output).to_be_bytes());
    bytes.extend_from_slice(output);
    let aside = dir.join(format!(".{key:032x}.{}.tmp", std::process::id()));
    write_private(&aside, &bytes)
        .and_then(|()| std::fs::rename(&aside, file).map_err(|e| e.to_string()))
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&aside);
        })
}

/// Makes the directory (and its parents) if missing, the last one readable by the user alone.
fn create_private(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("could not make {}: {e}", dir.display()))?;
    private(dir)
}

/// Writes a file only the user can read or write.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| e.to_string())?;
    file.write_all(bytes).map_err(|e| e.to_string())
}

/// The directory is the user's and nobody else can write to it.
fn private(dir: &Path) -> Result<(), String> {
    let meta = std::fs::metadata(dir).map_err(|e| e.to_string())?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    private_file(&meta)
}

/// Owned by this user, writable by no one else.
fn private_file(meta: &std::fs::Metadata) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me {
        return Err(format!("owned by uid {}, not this user ({me})", meta.uid()));
    }
    if meta.mode() & 0o022 != 0 {
        return Err(format!(
            "writable by others (mode {:o})",
            meta.mode() & 0o7777
        ));
    }
    Ok(())
}

/// Writes into `dir` the cache file a start with `python` reads, holding the worker's code
/// as `python` compiles it but labelled with the magic number `relabel` makes of its own (for
/// the test, in `lib.rs`, that a worker takes only code of its own bytecode format).
#[cfg(test)]
pub(crate) fn store_relabelled(dir: &Path, python: &Path, relabel: impl FnOnce(&mut Vec<u8>)) {
    let key = key(python).expect("a key");
    let scratch = dir.join("scratch");
    let mut compiled = compile(&scratch, &scratch.join("x.bin"), python, key).expect("compiles");
    let _ = std::fs::remove_dir_all(&scratch);
    relabel(&mut compiled.magic);
    let modules = compiled
        .modules
        .into_iter()
        .map(|(module, code)| Value::Tuple(vec![module.into(), Value::Bytes(code)]))
        .collect();
    let value = Value::Tuple(vec![Value::Bytes(compiled.magic), Value::List(modules)]);
    let mut output = Vec::new();
    marshal::encode(&Data::Owned(value), &mut output).expect("encodes");
    store(dir, &dir.join(format!("{key:032x}.bin")), key, &output).expect("stores");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cache file as `store` writes it, for `key`, of a compiler's output naming both
    /// modules.
    fn stored(dir: &Path, key: u128) -> PathBuf {
        let modules = sources()
            .iter()
            .map(|(name, _, _)| Value::Tuple(vec![(*name).into(), Value::Bytes(vec![0xe3])]))
            .collect();
        let value = Value::Tuple(vec![
            Value::Bytes(b"\xa7\r\r\n".to_vec()),
            Value::List(modules),
        ]);
        let mut output = Vec::new();
        marshal::encode(&Data::Owned(value), &mut output).unwrap();
        let file = dir.join(format!("{key:032x}.bin"));
        store(dir, &file, key, &output).unwrap();
        file
    }

    #[test]
    fn only_a_whole_file_of_the_users_own_is_read() {
        use std::os::unix::fs::PermissionsExt;
        let root = std::env::temp_dir().join(format!("cave-bytecode-read-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let dir = root.join("cache");
        let file = stored(&dir, 7);
        let read_it = |key| read(&dir, &file, key);
        assert_eq!(read_it(7).unwrap().magic, b"\xa7\r\r\n");
        assert!(read_it(8).is_err(), "another key's");
        let whole = std::fs::read(&file).unwrap();
        let mut changed = whole.clone();
        *changed.last_mut().unwrap() ^= 1;
        std::fs::write(&file, &changed).unwrap();
        assert!(read_it(7).unwrap_err().contains("checksum"));
        std::fs::write(&file, &whole[..whole.len() - 1]).unwrap();
        assert!(read_it(7).is_err(), "cut short");
        std::fs::write(&file, &whole).unwrap();
        assert!(read_it(7).is_ok());
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o620)).unwrap();
        assert!(read_it(7).unwrap_err().contains("writable by others"));
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o757)).unwrap();
        assert!(read_it(7).unwrap_err().contains("writable by others"));
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(read_it(7).is_ok());
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn what_is_not_the_compilers_output_is_refused() {
        for body in [&b""[..], b"N", b"\xa9\x00"] {
            assert!(parse(body).is_err(), "{body:?}");
        }
        let mut missing = Vec::new();
        let value = Value::Tuple(vec![Value::Bytes(vec![1, 2]), Value::List(vec![])]);
        marshal::encode(&Data::Owned(value), &mut missing).unwrap();
        assert_eq!(parse(&missing).unwrap_err(), "a module is missing");
    }
}
