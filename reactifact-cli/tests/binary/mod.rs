//! Runs the built `reactifact` binary on a copy of the demonstration store.

#![allow(dead_code)] // each test file uses part of it

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use tempfile::TempDir;

use crate::support;

/// What one run of the binary gave.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// The stdout as JSON (for `--json` runs).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.stdout))
    }

    /// Asserts exit 0 and returns self.
    pub fn ok(self) -> Self {
        assert_eq!(self.code, 0, "expected success: {self:?}");
        self
    }

    /// Asserts exit `code`, nothing on stdout, and a stderr containing `text`.
    pub fn fails(self, code: i32, text: &str) -> Self {
        assert_eq!(self.code, code, "expected exit {code}: {self:?}");
        assert!(self.stderr.contains(text), "stderr lacks {text:?}: {self:?}");
        self
    }
}

/// Runs `reactifact` with `args`, with no `REACTIFACT_STORE` from the environment.
pub fn reactifact<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Run {
    reactifact_env(args, None)
}

/// Runs `reactifact` with `args` and `REACTIFACT_STORE` set to `store`, if given.
pub fn reactifact_env<S: AsRef<std::ffi::OsStr>>(args: &[S], store: Option<&Path>) -> Run {
    let mut command = Command::new(env!("CARGO_BIN_EXE_reactifact"));
    command.args(args).env_remove("REACTIFACT_STORE");
    if let Some(store) = store {
        command.env("REACTIFACT_STORE", store);
    }
    let out = command.output().expect("the binary runs");
    Run {
        code: out.status.code().expect("the binary exited"),
        stdout: String::from_utf8(out.stdout).expect("stdout is UTF-8"),
        stderr: String::from_utf8(out.stderr).expect("stderr is UTF-8"),
    }
}

/// A store: a fresh copy of the demonstration store in a directory of its own.
pub struct Store {
    pub dir: TempDir,
    pub path: PathBuf,
}

impl Store {
    /// Runs `reactifact --store PATH args…`.
    pub fn run(&self, args: &[&str]) -> Run {
        let mut all: Vec<&std::ffi::OsStr> = vec!["--store".as_ref(), self.path.as_os_str()];
        all.extend(args.iter().map(std::ffi::OsStr::new));
        reactifact(&all)
    }

    /// Runs `reactifact --json --store PATH args…`, which must succeed, and parses its output.
    pub fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = vec!["--json"];
        all.extend(args);
        self.run(&all).ok().json()
    }

    /// The files in the store's directory (to see that no `-wal` or `-shm` appeared).
    pub fn files(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
}

/// A fresh copy of the demonstration store, built once per test binary by the library.
pub fn store() -> Store {
    static TEMPLATE: OnceLock<(TempDir, PathBuf)> = OnceLock::new();
    let (_, template) = TEMPLATE.get_or_init(|| {
        let dir = TempDir::new().unwrap();
        let path = dir.path().join("template.db");
        support::build(&path);
        assert!(
            !dir.path().join("template.db-wal").exists(),
            "the library left no WAL behind"
        );
        (dir, path)
    });
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("store.db");
    std::fs::copy(template, &path).unwrap();
    Store { dir, path }
}
