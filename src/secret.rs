//! Secret formats: API keys, session tokens, ids, and the
//! SHA-256 hash that is the only form a secret is ever stored or cached in.
use rand::RngExt;
use sha2::{Digest, Sha256};
use std::fmt;

/// Every API key secret starts with this.
pub const API_KEY_PREFIX: &str = "mpg_";
/// Every session token starts with this.
pub const SESSION_PREFIX: &str = "mps_";
/// Every admin token (for the admin API) starts with this.
pub const ADMIN_TOKEN_PREFIX: &str = "mpga_";

/// The base62 alphabet, in digit order: `0-9A-Za-z`.
const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
/// Random characters in an API key.
const KEY_BODY_LEN: usize = 32;
/// Base62 characters of the CRC32 checksum (62^6 > 2^32).
const KEY_CHECK_LEN: usize = 6;
/// Random characters in a session token.
const SESSION_BODY_LEN: usize = 43;
/// Total length of a session token.
const SESSION_LEN: usize = SESSION_PREFIX.len() + SESSION_BODY_LEN;
/// Characters of an API key shown as its display prefix.
const DISPLAY_PREFIX_LEN: usize = 8;

/// Why a token is not well-formed. Never carries the token itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FormatError {
    /// The token does not start with the expected prefix.
    #[error("wrong token prefix")]
    Prefix,
    /// The token has the wrong length.
    #[error("wrong token length")]
    Length,
    /// The token holds a character outside base62.
    #[error("token holds a character outside base62")]
    Alphabet,
    /// The API key checksum does not match its random part.
    #[error("token checksum mismatch")]
    Checksum,
}

/// SHA-256 of a secret; the only form a secret is stored or cached in.
/// `Debug` shows only the first four bytes. Equality is constant-time, so a
/// comparison never tells how many leading bytes matched.
#[derive(Clone, Copy)]
pub struct SecretHash(pub [u8; 32]);

impl PartialEq for SecretHash {
    /// Constant-time: the four words' differences are folded together and
    /// tested once, cheaper than a byte-wise `ct_eq` (the cache compares a
    /// digest on every lookup).
    fn eq(&self, other: &Self) -> bool {
        let (a, b) = (self.0.as_chunks::<8>().0, other.0.as_chunks::<8>().0);
        let diff = a.iter().zip(b).fold(0u64, |d, (a, b)| {
            d | (u64::from_ne_bytes(*a) ^ u64::from_ne_bytes(*b))
        });
        std::hint::black_box(diff) == 0
    }
}

impl Eq for SecretHash {}

impl std::hash::Hash for SecretHash {
    // Consistent with `eq`: equal hashes feed the same bytes.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        state.write(&self.0);
    }
}

impl SecretHash {
    /// Lower-case hex of the whole hash (how the store keeps it).
    pub fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The hash `to_hex` wrote (64 hex digits, either case), if `text` is one.
    pub fn from_hex(text: &str) -> Option<Self> {
        let mut out = [0u8; 32];
        hex::decode_to_slice(text, &mut out).ok()?;
        Some(SecretHash(out))
    }
}

impl fmt::Debug for SecretHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretHash({}…)", hex::encode(&self.0[..4]))
    }
}

/// SHA-256 of `secret`.
pub fn hash_secret(secret: &str) -> SecretHash {
    hash_bytes(secret.as_bytes())
}

/// SHA-256 of `bytes`.
pub fn hash_bytes(bytes: &[u8]) -> SecretHash {
    SecretHash(Sha256::digest(bytes).into())
}

/// `n` random base62 characters from the thread-local CSPRNG (OS-seeded ChaCha).
fn random_base62(n: usize) -> String {
    let mut rng = rand::rng();
    (0..n)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect()
}

/// The value of one base62 digit, or `None` outside the alphabet.
fn base62_value(c: u8) -> Option<u64> {
    match c {
        b'0'..=b'9' => Some(u64::from(c - b'0')),
        b'A'..=b'Z' => Some(u64::from(c - b'A') + 10),
        b'a'..=b'z' => Some(u64::from(c - b'a') + 36),
        _ => None,
    }
}

/// CRC32 of `body` as exactly six base62 digits, most significant first.
fn checksum_chars(body: &[u8]) -> [u8; KEY_CHECK_LEN] {
    let mut value = u64::from(crc32fast::hash(body));
    let mut out = [b'0'; KEY_CHECK_LEN];
    for slot in out.iter_mut().rev() {
        // `value % 62` is below 62, so the index is in range.
        *slot = ALPHABET[(value % 62) as usize];
        value /= 62;
    }
    out
}

/// A new API key: `mpg_` + 32 random base62 + 6 base62 of CRC32 over the 32.
/// Returns (secret, display prefix = the first 8 characters after `mpg_`).
pub fn generate_api_key() -> (String, String) {
    let secret = generate_checked(API_KEY_PREFIX);
    let prefix = secret[API_KEY_PREFIX.len()..][..DISPLAY_PREFIX_LEN].to_owned();
    (secret, prefix)
}

/// A new admin token: `mpga_` + 32 random base62 + 6 base62 of CRC32 over
/// the 32, as an API key is made.
pub fn generate_admin_token() -> String {
    generate_checked(ADMIN_TOKEN_PREFIX)
}

/// `prefix` + 32 random base62 + 6 base62 of CRC32 over the 32.
fn generate_checked(prefix: &str) -> String {
    let body = random_base62(KEY_BODY_LEN);
    let check = checksum_chars(body.as_bytes());
    let mut secret = String::with_capacity(prefix.len() + KEY_BODY_LEN + KEY_CHECK_LEN);
    secret.push_str(prefix);
    secret.push_str(&body);
    secret.extend(check.iter().map(|&b| char::from(b)));
    secret
}

/// Checks an API key's prefix, length, alphabet and checksum; no allocation,
/// no store access.
pub fn check_api_key_format(token: &str) -> Result<(), FormatError> {
    check_checked(token, API_KEY_PREFIX)
}

/// Checks an admin token's prefix, length, alphabet and checksum.
pub fn check_admin_token_format(token: &str) -> Result<(), FormatError> {
    check_checked(token, ADMIN_TOKEN_PREFIX)
}

/// Checks a checksummed secret made by [`generate_checked`] with `prefix`.
fn check_checked(token: &str, prefix: &str) -> Result<(), FormatError> {
    let rest = token.strip_prefix(prefix).ok_or(FormatError::Prefix)?;
    if token.len() != prefix.len() + KEY_BODY_LEN + KEY_CHECK_LEN {
        return Err(FormatError::Length);
    }
    let bytes = rest.as_bytes();
    let (body, check) = bytes.split_at(KEY_BODY_LEN);
    if !body.iter().all(|&c| base62_value(c).is_some()) {
        return Err(FormatError::Alphabet);
    }
    let mut claimed: u64 = 0;
    for &c in check {
        claimed = claimed * 62 + base62_value(c).ok_or(FormatError::Alphabet)?;
    }
    if claimed != u64::from(crc32fast::hash(body)) {
        return Err(FormatError::Checksum);
    }
    Ok(())
}

/// Base62 characters after `mpg_`/`mps_` from which a value counts as a
/// secret (real ones have 38 and 43; a truncated or mangled one still leaks).
const SECRET_MIN_BODY: usize = 16;

/// The fewest bytes that can hold a secret by [`looks_like_secret`]: shorter
/// text (decoded or not, as decoding only shortens) needs no look.
pub const SECRET_MIN_LEN: usize = 4 + SECRET_MIN_BODY;

/// Whether the bytes hold `mpg_`/`mps_`/`mpga_` (any case) followed by at
/// least `SECRET_MIN_BODY` base62 characters. No allocation;
/// used to keep secrets out of URLs, request ids and logs.
pub fn looks_like_secret(decoded: impl Iterator<Item = u8>) -> bool {
    let mut last = [0u8; 4];
    let mut run: Option<usize> = None;
    for b in decoded {
        let before = last[0];
        last = [last[1], last[2], last[3], b.to_ascii_lowercase()];
        run = match run {
            Some(n) if b.is_ascii_alphanumeric() => Some(n + 1),
            _ => None,
        };
        if run.is_some_and(|n| n >= SECRET_MIN_BODY) {
            return true;
        }
        if &last == b"mpg_" || &last == b"mps_" || (&last == b"pga_" && before == b'm') {
            run = Some(0);
        }
    }
    false
}

/// A new session token: `mps_` + 43 random base62 characters.
pub fn generate_session_token() -> String {
    let mut token = String::with_capacity(SESSION_LEN);
    token.push_str(SESSION_PREFIX);
    token.push_str(&random_base62(SESSION_BODY_LEN));
    token
}

/// Checks a session token's prefix, length and alphabet.
pub fn check_session_token_format(token: &str) -> Result<(), FormatError> {
    let rest = token
        .strip_prefix(SESSION_PREFIX)
        .ok_or(FormatError::Prefix)?;
    if token.len() != SESSION_LEN {
        return Err(FormatError::Length);
    }
    if !rest.bytes().all(|c| base62_value(c).is_some()) {
        return Err(FormatError::Alphabet);
    }
    Ok(())
}

/// A new API key id: `key_` + 16 base62 characters.
pub fn generate_key_id() -> String {
    generate_id("key_")
}

/// A new internal id: `prefix` + 16 base62 characters (e.g. `ses_…`).
pub fn generate_id(prefix: &str) -> String {
    let mut id = String::with_capacity(prefix.len() + 16);
    id.push_str(prefix);
    id.push_str(&random_base62(16));
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key whose checksum was computed outside the project, with Python's zlib:
    /// `python3 -c 'import zlib; A="0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    /// b="Vectors0Computed1Outside2The3Gw4"; v=zlib.crc32(b.encode()); s=""
    /// exec("for _ in range(6): s=A[v%62]+s; v//=62"); print("mpg_"+b+s)'`
    const OUTSIDE_KEY: &str = "mpg_Vectors0Computed1Outside2The3Gw40DhY2I";

    #[test]
    fn a_key_checksummed_outside_the_project_passes_and_a_changed_one_fails() {
        assert_eq!(check_api_key_format(OUTSIDE_KEY), Ok(()));
        let last = OUTSIDE_KEY.len() - 1;
        let changed = format!("{}J", &OUTSIDE_KEY[..last]);
        assert_eq!(check_api_key_format(&changed), Err(FormatError::Checksum));
        // Its SHA-256, by coreutils: `printf '%s' KEY | sha256sum`.
        assert_eq!(
            hash_secret(OUTSIDE_KEY).to_hex(),
            "547f603265c94ede778f630c3dad81ba70b1bb6c7478aa29f3ea57078ff6d909"
        );
    }

    #[test]
    fn hex_round_trips_and_nothing_else_parses() {
        let h = hash_secret("a");
        assert!(SecretHash::from_hex(&h.to_hex()) == Some(h));
        assert!(SecretHash::from_hex(&h.to_hex().to_uppercase()) == Some(h));
        for bad in [
            "zz".to_owned(),
            "g".repeat(64),
            format!("+f{}", &h.to_hex()[2..]),
        ] {
            assert!(SecretHash::from_hex(&bad).is_none(), "{bad}");
        }
    }
    use proptest::prelude::*;

    #[test]
    fn secret_hashes_compare_by_value() {
        use std::collections::HashSet;
        let a = hash_secret("mps_a");
        assert_eq!(a, hash_secret("mps_a"));
        assert_ne!(a, hash_secret("mps_b"));
        let mut last_byte = a;
        last_byte.0[31] ^= 1;
        assert_ne!(a, last_byte);
        for i in [0, 7, 8, 16, 24] {
            let mut other = a;
            other.0[i] ^= 0x80;
            assert_ne!(a, other, "byte {i}");
        }
        let set: HashSet<SecretHash> = [a, hash_secret("mps_a"), last_byte].into();
        assert_eq!(set.len(), 2);
    }

    #[test]
    fn secret_lookalikes_are_recognized_in_any_case_and_position() {
        let (key, _) = generate_api_key();
        let session = generate_session_token();
        let admin = generate_admin_token();
        for yes in [
            key.clone(),
            session.clone(),
            admin.clone(),
            admin.to_uppercase(),
            format!("trace-{key}"),
            key.to_uppercase(),
            format!("mpg_mpg_{}", &key[4..]),
            key[..20].to_string(),
        ] {
            assert!(looks_like_secret(yes.bytes()), "{yes}");
        }
        for no in [
            "mpg_prod",
            "mps_",
            "req-123",
            "mpg-0123456789abcdefgh",
            &key[4..],
        ] {
            assert!(!looks_like_secret(no.bytes()), "{no}");
        }
    }

    #[test]
    fn generated_api_key_has_documented_shape() {
        let (secret, prefix) = generate_api_key();
        assert_eq!(secret.len(), 42);
        assert!(secret.starts_with("mpg_"));
        assert_eq!(prefix, &secret[4..12]);
        assert_eq!(check_api_key_format(&secret), Ok(()));
    }

    #[test]
    fn admin_tokens_are_checksummed_like_api_keys_under_their_own_prefix() {
        let token = generate_admin_token();
        assert_eq!(token.len(), 43);
        assert!(token.starts_with("mpga_"));
        assert_eq!(check_admin_token_format(&token), Ok(()));
        assert_eq!(check_api_key_format(&token), Err(FormatError::Prefix));
        let (key, _) = generate_api_key();
        assert_eq!(check_admin_token_format(&key), Err(FormatError::Prefix));
        let mut typo = token.clone().into_bytes();
        typo[10] = if typo[10] == b'a' { b'b' } else { b'a' };
        let typo = String::from_utf8(typo).unwrap_or_default();
        assert_eq!(check_admin_token_format(&typo), Err(FormatError::Checksum));
        assert_eq!(
            check_admin_token_format(&token[..42]),
            Err(FormatError::Length)
        );
    }

    #[test]
    fn checksum_is_crc32_in_fixed_width_base62() {
        let body = "0".repeat(32);
        let crc = u64::from(crc32fast::hash(body.as_bytes()));
        let check = checksum_chars(body.as_bytes());
        let decoded = check
            .iter()
            .fold(0u64, |acc, &c| acc * 62 + base62_value(c).unwrap_or(99));
        assert_eq!(decoded, crc);
        let key = format!("mpg_{body}{}", std::str::from_utf8(&check).unwrap_or(""));
        assert_eq!(check_api_key_format(&key), Ok(()));
    }

    #[test]
    fn api_key_rejections_name_the_reason() {
        let (secret, _) = generate_api_key();
        assert_eq!(check_api_key_format("mps_abc"), Err(FormatError::Prefix));
        assert_eq!(
            check_api_key_format(&secret[..41]),
            Err(FormatError::Length)
        );
        assert_eq!(
            check_api_key_format(&format!("{secret}x")),
            Err(FormatError::Length)
        );
        let bad_alpha = format!("{}-{}", &secret[..10], &secret[11..]);
        assert_eq!(check_api_key_format(&bad_alpha), Err(FormatError::Alphabet));
        // Multi-byte UTF-8 must not panic on slicing.
        let utf8 = format!("mpg_{}é{}", "a".repeat(30), "b".repeat(6));
        assert!(check_api_key_format(&utf8).is_err());
    }

    #[test]
    fn session_tokens_round_trip_and_reject_garbage() {
        let token = generate_session_token();
        assert_eq!(token.len(), 47);
        assert_eq!(check_session_token_format(&token), Ok(()));
        assert_eq!(
            check_session_token_format(&token[..46]),
            Err(FormatError::Length)
        );
        assert_eq!(
            check_session_token_format(&format!("mps_{}!", "a".repeat(42))),
            Err(FormatError::Alphabet)
        );
        assert_eq!(check_session_token_format("abc"), Err(FormatError::Prefix));
        assert_ne!(generate_session_token(), generate_session_token());
    }

    #[test]
    fn ids_have_prefix_and_base62_tail() {
        let id = generate_key_id();
        assert!(id.starts_with("key_"));
        assert_eq!(id.len(), 20);
        assert!(id[4..].bytes().all(|c| base62_value(c).is_some()));
        assert!(generate_id("ses_").starts_with("ses_"));
    }

    #[test]
    fn hash_is_sha256_and_debug_hides_it() {
        let h = hash_secret("abc");
        assert_eq!(
            h.to_hex(),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        let dbg = format!("{h:?}");
        assert_eq!(dbg, "SecretHash(ba7816bf…)");
    }

    proptest! {
        #[test]
        fn generated_keys_always_pass(_seed in any::<u8>()) {
            let (secret, _) = generate_api_key();
            prop_assert_eq!(check_api_key_format(&secret), Ok(()));
        }

        #[test]
        fn any_single_character_change_fails(pos in 0usize..42, repl in proptest::char::any()) {
            let (secret, _) = generate_api_key();
            let mut chars: Vec<char> = secret.chars().collect();
            prop_assume!(chars[pos] != repl);
            chars[pos] = repl;
            let changed: String = chars.into_iter().collect();
            prop_assert!(check_api_key_format(&changed).is_err());
        }

        #[test]
        fn format_checks_never_panic(s in ".*") {
            let _ = check_api_key_format(&s);
            let _ = check_session_token_format(&s);
        }
    }
}
