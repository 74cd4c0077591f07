//! [`Problems`], the list every validation step adds to, and the limits
//! shared by more than one section.
use serde::de::DeserializeOwned;
use std::time::Duration;

use super::Problem;

/// The most connections a listener or an upstream target may be given: each
/// is a semaphore permit (tokio panics past `usize::MAX >> 3`), and draining
/// at shutdown acquires them all as one `u32`.
pub(super) const MAX_CONNECTIONS: usize = u32::MAX as usize;

/// Collects problems while walking the file.
#[derive(Default)]
pub(super) struct Problems {
    /// Each problem, and whether it is a parse (structural) one.
    list: Vec<(Problem, bool)>,
    /// TOML paths whose value failed to parse; defaults stood in for them.
    pub(super) failed: Vec<String>,
    /// Entries (`upstreams.NAME`, `rate_limit.policies.NAME`) that parsed but
    /// were refused: present, so a route naming one is not told it is unknown.
    refused: Vec<String>,
}

impl Problems {
    pub(super) fn add(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.list.push((
            Problem {
                path: path.into(),
                message: message.into(),
            },
            false,
        ));
    }

    /// Records that the entry at `path` is present but invalid (its problem is
    /// already listed).
    pub(super) fn refuse(&mut self, path: impl Into<String>) {
        self.refused.push(path.into());
    }

    /// Whether the entry at `path`, or the section holding it, is present but
    /// invalid: a reference to it would only echo the problem already listed.
    pub(super) fn invalid(&self, section: &str, path: &str) -> bool {
        self.failed.iter().any(|f| f == section || f == path)
            || self.refused.iter().any(|f| f == path)
    }

    pub(super) fn len(&self) -> usize {
        self.list.len()
    }

    /// Every parse problem, and every other problem not under a path that failed
    /// to parse (those would only be echoes of the defaults standing in for it).
    pub(super) fn finish(self) -> Vec<Problem> {
        let failed = self.failed;
        let under = |path: &str| {
            failed
                .iter()
                .any(|f| path == f || path.starts_with(&format!("{f}.")))
        };
        self.list
            .into_iter()
            .filter(|(p, parse)| *parse || !under(&p.path))
            .map(|(p, _)| p)
            .collect()
    }

    /// Deserializes one value, recording a failure at `base` + the inner path.
    pub(super) fn de<T: DeserializeOwned>(&mut self, base: &str, value: toml::Value) -> Option<T> {
        match serde_path_to_error::deserialize::<_, T>(value) {
            Ok(v) => Some(v),
            Err(err) => {
                let inner = err.path().to_string();
                let path = match inner.as_str() {
                    "." | "?" | "" => base.to_string(),
                    _ if base.is_empty() => inner,
                    _ => format!("{base}.{inner}"),
                };
                let message = err.into_inner().to_string().trim().replace('\n', " ");
                self.failed.push(base.to_string());
                self.list.push((Problem { path, message }, true));
                None
            }
        }
    }

    /// A section that may be absent (then its default).
    pub(super) fn section<T: DeserializeOwned + Default>(
        &mut self,
        table: &mut toml::Table,
        name: &str,
    ) -> T {
        match table.remove(name) {
            Some(v) => self.de(name, v).unwrap_or_default(),
            None => T::default(),
        }
    }

    pub(super) fn positive(&mut self, path: &str, d: Duration) {
        if d.is_zero() {
            self.add(path, "must be longer than zero");
        }
    }
}
