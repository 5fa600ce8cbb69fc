//! A cache of what the selected interpreter reported about itself, so that starting a runtime
//! does not run `python3` every time (behind a pyenv shim that alone takes about 0.2 s).
//!
//! An entry is used only if everything that could change the answer is as it was: the
//! interpreter named (path, size, modification time), the working directory (a pyenv shim
//! chooses by it), the variables Python and pyenv read, the interpreter it resolved to, and every
//! directory of the reported `sys.path` (a new `.pth` file, from `pip install -e`, changes its
//! directory). Anything unreadable is a miss, never an error.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

/// Bumped when the file's shape changes; other versions are ignored.
const CACHE_VERSION: u32 = 2;
/// Entries kept (one per interpreter and directory in use).
const MAX_ENTRIES: usize = 16;
/// Variables that change what an interpreter reports.
const KEY_VARIABLES: &[&str] = &[
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONUSERBASE",
    "PYTHONNOUSERSITE",
    "PYTHONSAFEPATH",
    "PYENV_VERSION",
    "PYENV_ROOT",
    "VIRTUAL_ENV",
    "CONDA_PREFIX",
];

/// What an interpreter reports about itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Reported {
    /// `major.minor`.
    pub version: (u32, u32),
    /// `sys.executable`: the real interpreter behind a shim.
    pub executable: PathBuf,
    /// `sys.prefix`.
    pub prefix: String,
    /// Where its shared libpython lives (`sysconfig`'s `LIBDIR`; empty if it says none): the
    /// library a program embedding this interpreter must load.
    #[serde(default)]
    pub libdir: String,
    /// `sys.path`, without the entry `-c` adds.
    pub sys_path: Vec<String>,
}

/// A file's identity for the cache: size and modification time in nanoseconds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Stamp(u64, u128);

fn stamp(path: &Path) -> Option<Stamp> {
    let meta = std::fs::metadata(path).ok()?;
    let modified = meta.modified().ok()?.duration_since(UNIX_EPOCH).ok()?;
    Some(Stamp(meta.len(), modified.as_nanos()))
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Key {
    interpreter: PathBuf,
    interpreter_stamp: Stamp,
    cwd: PathBuf,
    variables: Vec<(String, String)>,
}

impl Key {
    fn of(interpreter: &Path) -> Option<Self> {
        Some(Self {
            interpreter: interpreter.to_owned(),
            interpreter_stamp: stamp(interpreter)?,
            cwd: std::env::current_dir().ok()?,
            variables: KEY_VARIABLES
                .iter()
                .filter_map(|name| {
                    let value = std::env::var_os(name)?;
                    Some(((*name).to_owned(), value.to_string_lossy().into_owned()))
                })
                .collect(),
        })
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct Entry {
    key: Key,
    reported: Reported,
    /// The resolved interpreter and each `sys.path` directory, as they were.
    stamps: Vec<(PathBuf, Option<Stamp>)>,
}

impl Entry {
    fn still_valid(&self) -> bool {
        self.stamps.iter().all(|(path, was)| stamp(path) == *was)
    }
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct File {
    version: u32,
    entries: Vec<Entry>,
}

/// Where the cache lives: `$XDG_CACHE_HOME/cave-agent`, else `~/.cache/cave-agent`.
pub fn default_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME")
                .filter(|d| !d.is_empty())
                .map(|home| Path::new(&home).join(".cache"))
        })?;
    Some(base.join("cave-agent"))
}

fn read(dir: &Path) -> File {
    std::fs::read(dir.join("python-env.json"))
        .ok()
        .and_then(|bytes| serde_json::from_slice::<File>(&bytes).ok())
        .filter(|file| file.version == CACHE_VERSION)
        .unwrap_or_default()
}

fn write(dir: &Path, file: &File) {
    let written = (|| -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        // Written aside and renamed: a concurrent reader sees the old file or the new one.
        let tmp = dir.join(format!("python-env.json.{}", std::process::id()));
        std::fs::write(&tmp, serde_json::to_vec(file).unwrap_or_default())?;
        std::fs::rename(&tmp, dir.join("python-env.json"))
    })();
    if let Err(e) = written {
        // A cache that cannot be written costs a later start the question, nothing more.
        let _ = e;
    }
}

/// The report for `interpreter`: from the cache in `dir` if still valid, else from `ask`
/// (whose answer is then cached). `dir = None` disables the cache.
pub fn report<E>(
    dir: Option<&Path>,
    interpreter: &Path,
    ask: impl FnOnce(&Path) -> Result<Reported, E>,
) -> Result<Reported, E> {
    let (Some(dir), Some(key)) = (dir, Key::of(interpreter)) else {
        return ask(interpreter);
    };
    let mut file = read(dir);
    if let Some(entry) = file.entries.iter().find(|e| e.key == key)
        && entry.still_valid()
    {
        return Ok(entry.reported.clone());
    }
    let reported = ask(interpreter)?;
    let stamps = std::iter::once(reported.executable.clone())
        .chain(reported.sys_path.iter().map(PathBuf::from))
        .map(|path| {
            let stamp = stamp(&path);
            (path, stamp)
        })
        .collect();
    file.version = CACHE_VERSION;
    file.entries.retain(|e| e.key != key);
    file.entries.insert(
        0,
        Entry {
            key,
            reported: reported.clone(),
            stamps,
        },
    );
    file.entries.truncate(MAX_ENTRIES);
    write(dir, &file);
    Ok(reported)
}

const REPORT: &str = "import sys, sysconfig; print(sys.version_info[0]); print(sys.version_info[1]); print(sys.executable); print(sys.prefix); print(sysconfig.get_config_var('LIBDIR') or '')\n\
for p in sys.path: print(p)";

/// Runs `executable` and reads its report (no cache).
pub fn ask(executable: &Path) -> Result<Reported, String> {
    let output = std::process::Command::new(executable)
        .args(["-c", REPORT])
        .output()
        .map_err(|e| format!("could not run it: {e}"))?;
    if !output.status.success() {
        return Err(format!(
            "it exited with {}: {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let mut lines = text.lines();
    let mut next = || {
        lines
            .next()
            .map(str::to_owned)
            .ok_or_else(|| "its report was cut short".to_owned())
    };
    let major = next()?
        .parse()
        .map_err(|_| "it reported no version".to_owned())?;
    let minor = next()?
        .parse()
        .map_err(|_| "it reported no version".to_owned())?;
    let executable = PathBuf::from(next()?);
    let prefix = next()?;
    let libdir = next()?;
    let sys_path = lines.filter(|p| !p.is_empty()).map(str::to_owned).collect();
    Ok(Reported {
        version: (major, minor),
        executable,
        prefix,
        libdir,
        sys_path,
    })
}

/// What `executable` reports about itself, from the cache in [`default_dir`] when still valid.
pub fn describe(executable: &Path) -> Result<Reported, String> {
    report(default_dir().as_deref(), executable, ask)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    /// A fake interpreter: a real program that reports a fixed environment and counts how
    /// often it was asked.
    fn fake_interpreter(dir: &Path, site: &Path) -> PathBuf {
        let path = dir.join("python3");
        let script = format!(
            "#!/bin/sh\necho x >> {}\necho 3; echo 11; echo {}; echo /prefix; echo /prefix/lib; echo {}\n",
            dir.join("calls").display(),
            path.display(),
            site.display()
        );
        std::fs::write(&path, script).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn calls(dir: &Path) -> usize {
        std::fs::read_to_string(dir.join("calls"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    fn fake_ask(path: &Path) -> Result<Reported, String> {
        // Read by `sh` rather than executed: executing a file just written can fail with
        // ETXTBSY while another test's fork still holds the writing descriptor.
        let out = std::process::Command::new("/bin/sh")
            .arg(path)
            .output()
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let lines: Vec<&str> = text.lines().collect();
        Ok(Reported {
            version: (lines[0].parse().unwrap(), lines[1].parse().unwrap()),
            executable: PathBuf::from(lines[2]),
            prefix: lines[3].to_owned(),
            libdir: lines[4].to_owned(),
            sys_path: lines[5..].iter().map(|s| (*s).to_owned()).collect(),
        })
    }

    #[test]
    fn a_changed_interpreter_or_path_invalidates_the_cache() {
        let root = std::env::temp_dir().join(format!("cave-env-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (bin, site, cache) = (root.join("bin"), root.join("site"), root.join("cache"));
        for d in [&bin, &site] {
            std::fs::create_dir_all(d).unwrap();
        }
        let python = fake_interpreter(&bin, &site);

        let first = report(Some(&cache), &python, fake_ask).unwrap();
        assert_eq!(first.sys_path, [site.display().to_string()]);
        assert_eq!(calls(&bin), 1);
        assert_eq!(report(Some(&cache), &python, fake_ask).unwrap(), first);
        assert_eq!(calls(&bin), 1, "the second start asks nobody");

        // The interpreter changes (a new version installed in its place): asked again.
        std::thread::sleep(std::time::Duration::from_millis(20));
        let mut text = std::fs::read_to_string(&python).unwrap();
        text.push_str("# upgraded\n");
        std::fs::write(&python, text).unwrap();
        report(Some(&cache), &python, fake_ask).unwrap();
        assert_eq!(
            calls(&bin),
            2,
            "a changed interpreter invalidates the entry"
        );
        report(Some(&cache), &python, fake_ask).unwrap();
        assert_eq!(calls(&bin), 2);

        // A package adds a `.pth` file to site-packages: asked again.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(site.join("editable.pth"), "/somewhere\n").unwrap();
        report(Some(&cache), &python, fake_ask).unwrap();
        assert_eq!(
            calls(&bin),
            3,
            "a changed sys.path directory invalidates the entry"
        );

        // No cache directory, or an unreadable cache file: asked, never an error.
        report(None, &python, fake_ask).unwrap();
        assert_eq!(calls(&bin), 4);
        std::fs::write(cache.join("python-env.json"), "not json").unwrap();
        report(Some(&cache), &python, fake_ask).unwrap();
        assert_eq!(calls(&bin), 5);
        std::fs::remove_dir_all(&root).unwrap();
    }
}
