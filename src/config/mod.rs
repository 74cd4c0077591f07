//! Configuration: raw TOML (`raw`) → `validate` that collects *every* problem
//! with its TOML path → immutable typed [`Settings`].
//!
//! Each section (and each route, upstream and policy) is deserialized on its
//! own, so one typo does not hide the next: `check-config` lists them all.
mod builtin;
mod duration;
mod log_filter;
mod oidc;
mod problems;
mod rate_limit;
mod raw;
mod redact;
mod roles;
mod routes;
mod server;
mod settings;
mod signing;
mod store;
mod tracing;
mod upstream;
mod validate;

pub use crate::ip::TrustedProxies;
pub use builtin::{BuiltinService, Operation};
pub use duration::{format_duration, parse_duration};
pub use log_filter::log_filter;
pub use oidc::fetch_url_problem;
pub use raw::{AuthMode, BackendErrorPolicy, Balance, LogFormat, PolicyKey, PolicyMode};
pub use settings::*;
pub use signing::SigningKeys;
pub use tracing::{OtlpProtocol, TracingSettings};

use std::fmt;
use std::path::{Path, PathBuf};

/// Scopes the gateway itself knows: those of the clusters API it fronts and
/// those of the built-in key service.
pub const BUILTIN_SCOPES: [&str; 4] = [
    "clusters:read",
    "clusters:write",
    "api-keys:read",
    "api-keys:write",
];

/// One thing wrong with a configuration file, located by its TOML path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// e.g. `routes[2].upstream` (empty for whole-file problems).
    pub path: String,
    /// What is wrong, for a human.
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            f.write_str(&self.message)
        } else {
            write!(f, "{}: {}", self.path, self.message)
        }
    }
}

/// Every problem found in a configuration file.
#[derive(Debug, Clone, thiserror::Error)]
pub struct ConfigError {
    /// The file the problems are in.
    pub file: PathBuf,
    /// One entry per problem, in file order where known.
    pub problems: Vec<Problem>,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} problem(s)",
            self.file.display(),
            self.problems.len()
        )?;
        // A problem's further lines (a syntax error's excerpt and caret) are
        // indented under its first, all by the same amount.
        for p in &self.problems {
            for (i, line) in p.to_string().lines().enumerate() {
                let indent = if i == 0 { "  " } else { "    " };
                write!(f, "\n{indent}{line}")?;
            }
        }
        Ok(())
    }
}

impl Settings {
    /// Reads and validates a configuration file.
    pub fn load(file: &Path) -> Result<Settings, ConfigError> {
        Self::load_with(file, true)
    }

    fn load_with(file: &Path, tls_files: bool) -> Result<Settings, ConfigError> {
        let text = std::fs::read_to_string(file).map_err(|e| ConfigError {
            file: file.to_path_buf(),
            problems: vec![Problem {
                path: String::new(),
                message: format!("cannot read the file: {e}"),
            }],
        })?;
        validate::validate(&text, tls_files).map_err(|problems| ConfigError {
            file: file.to_path_buf(),
            problems,
        })
    }

    /// Validates configuration text; `Err` holds every problem found.
    pub fn parse(text: &str) -> Result<Settings, Vec<Problem>> {
        validate::validate(text, true)
    }

    /// Like [`Settings::load`], except that the server's certificate and
    /// key files need not exist: for the admin commands, which act on the
    /// store only. Everything else is validated as for `run`.
    pub fn load_without_tls_files(file: &Path) -> Result<Settings, ConfigError> {
        Self::load_with(file, false)
    }

    /// Index of a rate-limit policy by name.
    pub fn policy_index(&self, name: &str) -> Option<usize> {
        self.rate_limit.policies.iter().position(|p| p.name == name)
    }
}

#[cfg(test)]
mod tests;
