//! `[upstreams.NAME] sign_identity_key_env`: the HMAC key that signs the
//! identity headers forwarded to an upstream, read from the environment
//! variable the file names (the file itself holds no secret), checked when
//! the file is validated so that `check-config` and start-up catch a missing
//! key. Neither a value nor a part of one ever reaches an error or `Debug`.
use std::ffi::OsString;
use std::fmt;

use super::problems::Problems;

/// Reads one environment variable (the process's own, or a test's table).
pub(super) type Env<'a> = &'a dyn Fn(&str) -> Option<OsString>;

/// The signing key of an upstream, and the variables it came from.
#[derive(Clone, PartialEq, Eq)]
pub struct SigningKeys {
    /// The variable holding the key that signs.
    pub key_env: String,
    /// The key: the variable's value, its bytes as they stand.
    key: Box<[u8]>,
    /// The variable holding the previous key, which only verifiers use
    /// while they move to the new one; checked like the first, never used
    /// to sign.
    pub previous_key_env: Option<String>,
}

impl SigningKeys {
    /// The key that signs.
    pub fn key(&self) -> &[u8] {
        &self.key
    }
}

impl fmt::Debug for SigningKeys {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKeys")
            .field("key_env", &self.key_env)
            .field("key", &"<redacted>")
            .field("previous_key_env", &self.previous_key_env)
            .finish()
    }
}

/// The keys `key_env` and `previous_env` name, for the upstream at `path`;
/// a problem at `PATH.sign_identity_key_env` (or `…previous_key_env`) for a
/// variable that is unset, empty or not UTF-8.
pub(super) fn signing_keys(
    p: &mut Problems,
    path: &str,
    key_env: Option<String>,
    previous_env: Option<String>,
    env: Env<'_>,
) -> Option<SigningKeys> {
    let previous_ok = match &previous_env {
        Some(var) => read(
            p,
            &format!("{path}.sign_identity_previous_key_env"),
            var,
            env,
        )
        .is_some(),
        None => true,
    };
    let Some(key_env) = key_env else {
        if previous_env.is_some() {
            p.add(
                format!("{path}.sign_identity_previous_key_env"),
                "needs sign_identity_key_env (the previous key never signs)",
            );
        }
        return None;
    };
    let key = read(p, &format!("{path}.sign_identity_key_env"), &key_env, env)?;
    previous_ok.then_some(SigningKeys {
        key_env,
        key,
        previous_key_env: previous_env,
    })
}

/// The bytes of variable `var`; a problem at `at` when there are none.
fn read(p: &mut Problems, at: &str, var: &str, env: Env<'_>) -> Option<Box<[u8]>> {
    if var.is_empty() || var.contains(['=', '\0']) {
        p.add(at, format!("{var:?} is not an environment variable name"));
        return None;
    }
    let problem = match env(var).map(OsString::into_string) {
        Some(Ok(value)) if !value.is_empty() => return Some(value.into_bytes().into()),
        Some(Ok(_)) => "is empty",
        Some(Err(_)) => "is not valid UTF-8",
        None => "is not set",
    };
    p.add(at, format!("environment variable {var} {problem}"));
    None
}
