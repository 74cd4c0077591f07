//! [`Problems`], the list every validation step adds to, and the limits
//! shared by more than one section.
use serde::de::DeserializeOwned;
use std::time::Duration;

use super::Problem;

/// The most connections a listener or an upstream target may be given: each
/// is a semaphore permit (tokio panics past `usize::MAX >> 3`), and draining
/// at shutdown acquires them all as one `u32`.
pub(super) const MAX_CONNECTIONS: usize = u32::MAX as usize;

/// A value with more bad keys than this is reported that far, then as a whole.
const MAX_PARSE_PROBLEMS: usize = 64;

/// Removes the key at `segments` (table keys, outermost first) from `value`;
/// false if there is none.
fn remove_path(value: &mut toml::Value, segments: &[String]) -> bool {
    let Some((last, parents)) = segments.split_last() else {
        return false;
    };
    let mut at = value;
    for key in parents {
        match at.get_mut(key.as_str()) {
            Some(next) => at = next,
            None => return false,
        }
    }
    at.as_table_mut().and_then(|t| t.remove(last)).is_some()
}

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

    /// Deserializes one value, recording each failure at `base` + its inner
    /// path. A key that fails is taken out and the rest read again, so every
    /// bad key of a section is reported in one run. When every key taken out
    /// was unknown, what is left is what the file meant: it is returned, and
    /// checked like any other. Otherwise defaults would stand in for what
    /// failed: `None`, and the later problems under `base` are dropped as
    /// echoes of those defaults.
    pub(super) fn de<T: DeserializeOwned>(
        &mut self,
        base: &str,
        mut value: toml::Value,
    ) -> Option<T> {
        let mut only_unknown = true;
        let mut removed: Vec<Vec<String>> = Vec::new();
        for _ in 0..MAX_PARSE_PROBLEMS {
            let err = match serde_path_to_error::deserialize::<_, T>(value.clone()) {
                Ok(v) if only_unknown => return Some(v),
                Ok(_) => {
                    self.failed.push(base.to_string());
                    return None;
                }
                Err(err) => err,
            };
            let segments: Vec<String> = err
                .path()
                .iter()
                .map_while(|s| match s {
                    serde_path_to_error::Segment::Map { key } => Some(key.clone()),
                    _ => None,
                })
                .collect();
            let inner = err.path().to_string();
            let path = match inner.as_str() {
                "." | "?" | "" => base.to_string(),
                _ if base.is_empty() => inner,
                _ => format!("{base}.{inner}"),
            };
            let message = err.into_inner().to_string().trim().replace('\n', " ");
            // A required key we took out is missing now: its problem is listed.
            let missing = message
                .strip_prefix("missing field `")
                .and_then(|m| m.split('`').next());
            if let Some(name) = missing {
                let mut key = segments.clone();
                key.push(name.to_owned());
                if removed.contains(&key) {
                    self.failed.push(base.to_string());
                    return None;
                }
            }
            let removable = missing.is_none() && !segments.is_empty();
            only_unknown &= message.starts_with("unknown field");
            self.list.push((Problem { path, message }, true));
            // The key (or the list holding the bad element) comes out.
            if !removable || !remove_path(&mut value, &segments) {
                self.failed.push(base.to_string());
                return None;
            }
            removed.push(segments);
        }
        self.failed.push(base.to_string());
        None
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
