//! Header fields: the names the gateway sets, the [`Field`]s it writes as
//! whole lines, and the parse of a field name from HTTP/1.1 bytes.
use http::header::{self, HeaderName};

/// `X-Request-Id`
pub const X_REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// `Content-Digest` (RFC 9530), which the gateway sets on a signed request
/// with a body.
pub const CONTENT_DIGEST: HeaderName = HeaderName::from_static("content-digest");

/// Client fields that some upstream stacks take as the client's address,
/// the original request or an authenticated user, past what the gateway
/// checked (`X-Middleware-Subrequest`: Next.js, CVE-2025-29927;
/// `X-Remote-User`: auth-proxy setups; `X-Envoy-External-Address`: Envoy).
/// Removed from every forwarded request unless a route names one in
/// `keep_client_headers`; lower case, as `HeaderName`s are.
pub const STACK_TRUSTED_FIELDS: [&str; 12] = [
    "x-forwarded",
    "forwarded-for",
    "fastly-client-ip",
    "x-original-forwarded-for",
    "x-envoy-external-address",
    "x-original-uri",
    "x-original-host",
    "x-original-method",
    "x-middleware-subrequest",
    "x-remote-user",
    "remote-user",
    "x-auth-request-user",
];

/// A field the gateway adds: its name, and the start of its line on the
/// wire (`name: `), written as one piece.
pub(crate) struct Field {
    pub(crate) name: HeaderName,
    pub(crate) line: &'static [u8],
}

/// A `static` [`Field`] named `$field` for the constant name `$name`.
macro_rules! field {
    ($vis:vis $field:ident, $name:ident, $line:literal) => {
        $vis static $field: $crate::http_core::fields::Field = $crate::http_core::fields::Field {
            name: $name,
            line: $line,
        };
    };
}
pub(crate) use field;

/// Fields a sender writes into a message's head after the message's own, as
/// `name: value` lines: how the HTTP/1.1 client is handed the fields a proxy
/// adds to a request, without knowing what they are.
pub trait FieldLines {
    /// Appends the fields as `name: value` lines.
    fn write_lines(&self, out: &mut Vec<u8>);
}
field!(pub(crate) F_REQUEST_ID, X_REQUEST_ID, b"x-request-id: ");

/// A field name read off the wire. The names nearly every request and
/// response carries, spelled as clients and servers send them (lower case,
/// or capitalized as curl, wrk and nginx do), are matched as they stand;
/// any other spelling or name goes through `HeaderName::from_bytes`, which
/// lowercases the name into a buffer and then matches it against all the
/// standard names, several times the work of this match.
pub(crate) fn field_name(name: &[u8]) -> Result<HeaderName, header::InvalidHeaderName> {
    use header::*;
    Ok(match name {
        b"host" | b"Host" => HOST,
        b"authorization" | b"Authorization" => AUTHORIZATION,
        b"user-agent" | b"User-Agent" => USER_AGENT,
        b"accept" | b"Accept" => ACCEPT,
        b"accept-encoding" | b"Accept-Encoding" => ACCEPT_ENCODING,
        b"content-type" | b"Content-Type" => CONTENT_TYPE,
        b"content-length" | b"Content-Length" => CONTENT_LENGTH,
        b"connection" | b"Connection" => CONNECTION,
        b"server" | b"Server" => SERVER,
        b"date" | b"Date" => DATE,
        b"cache-control" | b"Cache-Control" => CACHE_CONTROL,
        b"transfer-encoding" | b"Transfer-Encoding" => TRANSFER_ENCODING,
        _ => return HeaderName::from_bytes(name),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_names_match_the_general_parse_in_every_spelling() {
        for name in [
            "host",
            "Host",
            "HOST",
            "authorization",
            "Authorization",
            "user-agent",
            "User-Agent",
            "accept",
            "Accept",
            "accept-encoding",
            "Accept-Encoding",
            "content-type",
            "Content-Type",
            "content-length",
            "Content-Length",
            "connection",
            "Connection",
            "server",
            "Server",
            "date",
            "Date",
            "cache-control",
            "Cache-Control",
            "transfer-encoding",
            "Transfer-Encoding",
            "x-request-id",
            "X-Custom",
            "hosts",
            "hos",
            "ETag",
        ] {
            assert_eq!(
                field_name(name.as_bytes()).unwrap(),
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                "{name}"
            );
        }
        for bad in ["", "bad name", "x:y", "caf\u{e9}"] {
            assert!(field_name(bad.as_bytes()).is_err(), "{bad:?}");
        }
    }
}
