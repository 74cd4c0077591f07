//! The strict query parser of the pipeline's validation stage: names and values
//! percent-decoded, and every name at most once ("never first wins").
use crate::secret::{looks_like_secret, SECRET_MIN_LEN};
use std::borrow::Cow;

/// Most parameters a query may carry.
const MAX_PARAMS: usize = 64;

/// Why a query is refused (400, naming the parameter where there is one).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// A parameter given more than once (after decoding its name).
    #[error("{0}: repeated parameter")]
    Repeated(String),
    /// Malformed escapes or invalid UTF-8 after decoding: the parameter's
    /// decoded name, or `query` when the name itself is malformed.
    #[error("{0}: malformed percent-encoding")]
    BadEncoding(String),
    /// More than [`MAX_PARAMS`] parameters.
    #[error("too many query parameters")]
    TooMany,
    /// A required parameter is absent.
    #[error("{0}: required")]
    Missing(String),
    /// A required parameter is empty.
    #[error("{0}: empty")]
    Empty(String),
    /// A name that is not the parameter but that some upstream framework
    /// reads as it (see [`find_lookalike`]): the name, decoded.
    #[error("{0}: reads as {1} to some upstream frameworks")]
    Lookalike(String, String),
}

/// A parsed query string.
#[derive(Debug, Default)]
pub struct Query<'a> {
    raw: &'a str,
    params: Vec<(Cow<'a, str>, Cow<'a, str>)>,
}

fn hex(b: u8) -> Option<u8> {
    (b as char).to_digit(16).map(|d| d as u8)
}

/// Percent-decodes (`+` = space when `plus` is set); borrows when nothing
/// changes. `None` for a malformed escape or invalid UTF-8.
fn decode(raw: &str, plus: bool) -> Option<Cow<'_, str>> {
    if !raw.bytes().any(|b| b == b'%' || (plus && b == b'+')) {
        return Some(Cow::Borrowed(raw));
    }
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let h = bytes.get(i + 1).copied().and_then(hex);
                let l = bytes.get(i + 2).copied().and_then(hex);
                match (h, l) {
                    (Some(h), Some(l)) => out.push(h << 4 | l),
                    _ => return None,
                }
                i += 3;
            }
            b'+' if plus => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).ok().map(Cow::Owned)
}

/// A path parameter's value, percent-decoded as the upstream will read it
/// (`+` stays `+`: that rule is the query's); borrows when it has no escape.
/// `None` for a malformed escape or invalid UTF-8, which stage 1 refuses.
pub fn decode_segment(raw: &str) -> Option<Cow<'_, str>> {
    decode(raw, false)
}

/// Percent-decodes lazily (`+` = space); a malformed escape stays as it is.
/// The `&`-separated pieces of a query string, each split at its first `=`
/// (no `=`: no value; an empty piece is `("", None)`). A byte scan each:
/// `str::split` with a char pattern costs more than the whole scan on these
/// short strings.
fn pieces(raw: &str) -> impl Iterator<Item = (&str, Option<&str>)> {
    let mut rest = Some(raw);
    std::iter::from_fn(move || {
        let r = rest?;
        let (piece, next) = cut(r, b'&');
        rest = next;
        Some(cut(piece, b'='))
    })
}

/// `s` split at its first `sep` (an ASCII byte): what is before it, and
/// what is after it if it was found.
fn cut(s: &str, sep: u8) -> (&str, Option<&str>) {
    match s.bytes().position(|b| b == sep) {
        Some(i) => (&s[..i], Some(&s[i + 1..])),
        None => (s, None),
    }
}

fn decoded_bytes(raw: &str) -> impl Iterator<Item = u8> + '_ {
    let bytes = raw.as_bytes();
    let mut i = 0;
    std::iter::from_fn(move || {
        let b = *bytes.get(i)?;
        i += 1;
        Some(match b {
            b'%' => match (
                bytes.get(i).copied().and_then(hex),
                bytes.get(i + 1).copied().and_then(hex),
            ) {
                (Some(h), Some(l)) => {
                    i += 2;
                    h << 4 | l
                }
                _ => b'%',
            },
            b'+' => b' ',
            b => b,
        })
    })
}

/// Whether the path, percent-decoded, holds an `mpg_`/`mps_` secret (a
/// client that put its key in a path segment): refused like one in the
/// query, before it could be forwarded. Paths shorter than a secret need no
/// look.
pub fn path_holds_secret(path: &str) -> bool {
    path.len() >= SECRET_MIN_LEN && looks_like_secret(decoded_bytes(path))
}

/// The first parameter of `raw` (the part after `?`) whose decoded name or
/// value looks like an `mpg_`/`mps_` secret, named for `details.field`: its
/// decoded name, or `query` when the name itself is the secret. Secrets in
/// URLs end up in logs, histories and upstreams, so such requests are refused.
pub fn find_secret_param(raw: &str) -> Option<String> {
    if raw.len() < SECRET_MIN_LEN {
        return None;
    }
    for (name, value) in pieces(raw) {
        let value = value.unwrap_or("");
        if name.len() >= SECRET_MIN_LEN && looks_like_secret(decoded_bytes(name)) {
            return Some("query".to_string());
        }
        if value.len() >= SECRET_MIN_LEN && looks_like_secret(decoded_bytes(value)) {
            let name: Vec<u8> = decoded_bytes(name).collect();
            return Some(String::from_utf8_lossy(&name).into_owned());
        }
    }
    None
}

/// Whether `decoded`, a percent-decoded name, equals `wanted` once read as
/// PHP and ASP.NET read names: leading spaces and trailing `[]`s dropped,
/// ASCII case folded, and `.`, space and `+` taken as `_`.
fn reads_as(decoded: &[u8], wanted: &[u8]) -> bool {
    let start = decoded
        .iter()
        .position(|&b| b != b' ')
        .unwrap_or(decoded.len());
    let mut name = &decoded[start..];
    while let Some(rest) = name.strip_suffix(b"[]") {
        name = rest;
    }
    name.len() == wanted.len() && name.iter().zip(wanted).all(|(a, b)| fold(*a) == fold(*b))
}

/// One byte of a name as the lenient frameworks read it.
fn fold(b: u8) -> u8 {
    match b {
        b'.' | b' ' | b'+' => b'_',
        b => b.to_ascii_lowercase(),
    }
}

/// The first name in `raw` standing after a `;`, which Rack 2 and Bottle
/// read as a separator like `&`, that reads as `wanted` ([`reads_as`]).
fn after_semicolons(raw: &str, wanted: &[u8]) -> Option<String> {
    for piece in raw.split('&') {
        for name in piece.split(';').skip(1).map(|p| cut(p, b'=').0) {
            let decoded: Vec<u8> = decoded_bytes(name).collect();
            if reads_as(&decoded, wanted) {
                return Some(String::from_utf8_lossy(&decoded).into_owned());
            }
        }
    }
    None
}

impl<'a> Query<'a> {
    /// Parses `raw` (the part after `?`), refusing repeats and bad escapes.
    pub fn parse(raw: Option<&'a str>) -> Result<Self, QueryError> {
        let mut params: Vec<(Cow<'a, str>, Cow<'a, str>)> = Vec::new();
        let Some(raw) = raw else {
            return Ok(Query { raw: "", params });
        };
        // Empty pieces (`a=1&&b=2`) are skipped.
        for (name, value) in pieces(raw).filter(|(n, v)| !n.is_empty() || v.is_some()) {
            if params.len() == MAX_PARAMS {
                return Err(QueryError::TooMany);
            }
            let value = value.unwrap_or("");
            let name = decode(name, true).ok_or_else(|| QueryError::BadEncoding("query".into()))?;
            let value =
                decode(value, true).ok_or_else(|| QueryError::BadEncoding(name.to_string()))?;
            if params.iter().any(|(n, _)| *n == name) {
                return Err(QueryError::Repeated(name.into_owned()));
            }
            params.push((name, value));
        }
        Ok(Query { raw, params })
    }

    /// The first name that is not `param` but that an upstream framework
    /// may read as `param`, decoded: equal to it after ASCII case folding,
    /// reading `.`, space and `+` as `_` (PHP, and case-blind ASP.NET),
    /// dropping leading spaces and a trailing `[]` (PHP), or standing after a
    /// `;`, which Rack 2 and Bottle read as a separator like `&`. Names are
    /// compared percent-decoded, so `organization%5Fid` is `param` itself.
    /// Such a name could carry an organization the gateway never checked to
    /// an upstream that reads the query instead of `X-Mpg-Organization-Id`.
    pub fn lookalike(&self, param: &str) -> Option<String> {
        let wanted = param.as_bytes();
        // The names read here: only one at least as long as `param` can
        // read as it (decoding is done, and the dropped `[]` only shorten).
        let read = self.params.iter().map(|(n, _)| n).find(|n| {
            n.len() >= wanted.len() && n.as_ref() != param && reads_as(n.as_bytes(), wanted)
        });
        match read {
            Some(name) => Some(name.to_string()),
            None if self.raw.as_bytes().contains(&b';') => after_semicolons(self.raw, wanted),
            None => None,
        }
    }

    /// The decoded value of `name`, if present.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_ref())
    }

    /// `name`, present (exactly once, as parsing guarantees) and non-empty.
    pub fn require(&self, name: &str) -> Result<&str, QueryError> {
        match self.get(name) {
            None => Err(QueryError::Missing(name.to_string())),
            Some("") => Err(QueryError::Empty(name.to_string())),
            Some(v) => Ok(v),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn decodes_names_and_values() {
        let q = Query::parse(Some("organization_id=acme%20inc&x=a+b&flag")).unwrap();
        assert_eq!(q.require("organization_id").unwrap(), "acme inc");
        assert_eq!(q.get("x"), Some("a b"));
        assert_eq!(q.get("flag"), Some(""));
        assert!(Query::parse(None).unwrap().get("x").is_none());
    }

    #[test]
    fn repeats_are_refused_even_when_encoded_differently() {
        for raw in [
            "organization_id=a&organization_id=b",
            "organization_id=a&organization%5Fid=b",
            "organization_id=a&organization_id=a",
        ] {
            assert_eq!(
                Query::parse(Some(raw)).unwrap_err(),
                QueryError::Repeated("organization_id".into()),
                "{raw}"
            );
        }
        // Different names stay different.
        assert!(Query::parse(Some("organization_id=a&organization_id[]=b")).is_ok());
    }

    #[test]
    fn lookalikes_of_the_organization_parameter_are_found() {
        let p = "organization_id";
        for (raw, name) in [
            (
                "organization_id=acme&organization.id=evil",
                "organization.id",
            ),
            (
                "organization_id=acme&organization+id=evil",
                "organization id",
            ),
            (
                "organization_id=acme&organization%20id=evil",
                "organization id",
            ),
            (
                "organization_id=acme&ORGANIZATION_ID=evil",
                "ORGANIZATION_ID",
            ),
            (
                "organization_id=acme&Organization_Id=evil",
                "Organization_Id",
            ),
            (
                "organization_id=acme&organization_id[]=evil",
                "organization_id[]",
            ),
            (
                "organization_id=acme&organization_id%5B%5D=evil",
                "organization_id[]",
            ),
            (
                "organization_id=acme&%20organization_id=evil",
                " organization_id",
            ),
            (
                "organization_id=acme&organization%2Bid=evil",
                "organization+id",
            ),
            (
                "organization_id=acme&x=1;organization_id=evil",
                "organization_id",
            ),
            (
                "organization_id=acme;organization_id=evil",
                "organization_id",
            ),
            (
                "x=1;organization.id=evil&organization_id=acme",
                "organization.id",
            ),
        ] {
            let q = Query::parse(Some(raw)).unwrap();
            assert_eq!(q.lookalike(p).as_deref(), Some(name), "{raw}");
        }
        for raw in [
            "organization_id=acme",
            "organization%5Fid=acme",
            "organization_id=acme&organization_idx=1&organization=2",
            "organization_id=acme;x=1&limit=5",
            "organization_id=a.b+c&cursor=organization.id",
            "",
        ] {
            assert_eq!(Query::parse(Some(raw)).unwrap().lookalike(p), None, "{raw}");
        }
    }

    #[test]
    fn missing_empty_and_malformed() {
        let q = Query::parse(Some("a=1&organization_id=")).unwrap();
        assert_eq!(
            q.require("organization_id"),
            Err(QueryError::Empty("organization_id".into()))
        );
        assert_eq!(q.require("b"), Err(QueryError::Missing("b".into())));
        assert_eq!(
            Query::parse(Some("a=%zz")).unwrap_err(),
            QueryError::BadEncoding("a".into())
        );
        assert_eq!(
            Query::parse(Some("b=1&%61=%ff")).unwrap_err(),
            QueryError::BadEncoding("a".into())
        );
        assert_eq!(
            Query::parse(Some("a=1&b%ff=1")).unwrap_err(),
            QueryError::BadEncoding("query".into())
        );
        let many: Vec<String> = (0..65).map(|i| format!("p{i}=1")).collect();
        assert_eq!(
            Query::parse(Some(&many.join("&"))).unwrap_err(),
            QueryError::TooMany
        );
    }

    #[test]
    fn secret_looking_parameters_are_found_in_any_encoding() {
        let key = "mpg_0123456789abcdefABCDEFghij0123456789";
        let session = "mps_0123456789abcdefABCDEFghij0123456789abcd";
        for (raw, want) in [
            (
                format!("organization_id=acme&api_key={key}"),
                Some("api_key"),
            ),
            (format!("token={session}"), Some("token")),
            (format!("t=%6dpg_{}", &key[4..]), Some("t")),
            (format!("t=%6D%70%67%5f{}", &key[4..]), Some("t")),
            (format!("auth=Bearer+{key}"), Some("auth")),
            (format!("auth=Bearer%20{key}&x=1"), Some("auth")),
            (format!("a%5fkey={}", key.to_uppercase()), Some("a_key")),
            (key.to_string(), Some("query")),
            (format!("{key}=1"), Some("query")),
            (format!("x=%zz&k={key}"), Some("k")),
            ("name=mpg_prod&x=mps_short".to_string(), None),
            ("name=mpg_0123456789abcde".to_string(), None),
            ("organization_id=acme".to_string(), None),
            (String::new(), None),
        ] {
            assert_eq!(find_secret_param(&raw).as_deref(), want, "{raw}");
        }
    }

    proptest! {
        #[test]
        fn a_secret_anywhere_in_a_value_is_found(
            before in "[a-z0-9_=+ .-]{0,20}",
            body in "[0-9A-Za-z]{16,43}",
            after in "[a-z0-9_ .-]{0,20}",
            session in any::<bool>(),
        ) {
            let prefix = if session { "mps_" } else { "mpg_" };
            let raw = format!("p={before}{prefix}{body}{after}");
            prop_assert!(find_secret_param(&raw).is_some(), "{}", raw);
        }

        #[test]
        fn never_panics(s in "[ -~]{0,80}") {
            let _ = find_secret_param(&s);
            let _ = Query::parse(Some(&s)).map(|q| q.get("a").map(str::len));
        }
    }
}
