//! An HTTP/1.1 target's response fields, relayed as they arrived.
//!
//! The upstream client does not build a header map of what it passes on
//! unchanged: a map costs a name lookup, a value check (httparse has
//! already made the same one), a hash and an insertion per field, and the
//! HTTP/1.1 writer then walks it again. It keeps the head's bytes and where
//! each relayed field lies ([`RelayedFields`], in the response's
//! extensions); the header map holds only `Content-Length` and what the
//! gateway adds. The hop-by-hop fields, the ones `Connection` names and the
//! framing fields are left out by the client, so nothing here needs
//! sanitizing again.
//!
//! A field the gateway sets itself (`X-Request-Id`, `X-RateLimit-*`) is in
//! the header map and wins: a relayed field of the same name is not sent,
//! as when the gateway replaced it in a map. The HTTP/1.1 writer writes the
//! relayed fields first, then the map's ([`RelayedFields::write_to`]); for
//! HTTP/2 (hyper's server) and for anything else that reads a response's
//! headers, [`into_header_map`](crate::http_core::service::into_header_map) folds them into the map first.
use bytes::Bytes;
use http::header::{HeaderMap, HeaderValue};
use smallvec::SmallVec;

use crate::http_core::fields::field_name;

/// Where a relayed field's name and value lie in the head: name start and
/// end, value start and end.
pub(crate) type FieldAt = [u32; 4];

/// A response's relayed fields: the head they were read from, and where
/// each lies in it, in the order received. One allocation for a head with
/// up to [`INLINE_FIELDS`] of them, and one pointer wide: the response it
/// rides in is moved through several futures.
#[derive(Clone, Debug)]
pub(crate) struct RelayedFields(Box<Fields>);

/// Relayed fields most responses stay within.
const INLINE_FIELDS: usize = 8;

#[derive(Clone, Debug)]
struct Fields {
    head: Bytes,
    at: SmallVec<[FieldAt; INLINE_FIELDS]>,
}

impl RelayedFields {
    /// The fields at `at` in `head` (positions httparse gave for them).
    pub(crate) fn new(head: Bytes, at: impl IntoIterator<Item = FieldAt>) -> Self {
        RelayedFields(Box::new(Fields {
            head,
            at: at.into_iter().collect(),
        }))
    }

    /// How many fields there are.
    pub(crate) fn len(&self) -> usize {
        self.0.at.len()
    }

    /// Each field's name (as received: any case) and value.
    fn fields(&self) -> impl Iterator<Item = (&[u8], &[u8])> {
        self.0.at.iter().map(|&[ns, ne, vs, ve]| {
            (
                &self.0.head[ns as usize..ne as usize],
                &self.0.head[vs as usize..ve as usize],
            )
        })
    }

    /// Writes the fields neither set in `map` nor `overridden` (the
    /// gateway's stamped ones) as `name: value` lines; returns whether one
    /// of them is `Date`.
    pub(crate) fn write_to(
        &self,
        map: &HeaderMap,
        overridden: impl Fn(&[u8]) -> bool,
        out: &mut Vec<u8>,
    ) -> bool {
        // Bit `n`: the map has a name `n` bytes long (63: that long or
        // longer). Most fields are told apart from the map's by length.
        let lengths = map
            .keys()
            .fold(0u64, |bits, k| bits | 1 << k.as_str().len().min(63));
        let mut has_date = false;
        for (name, value) in self.fields() {
            if lengths & 1 << name.len().min(63) != 0 && in_map(map, name) || overridden(name) {
                continue;
            }
            has_date |= name.eq_ignore_ascii_case(b"date");
            out.extend_from_slice(name);
            out.extend_from_slice(b": ");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
        has_date
    }
}

impl RelayedFields {
    /// Appends the fields to `headers`, after the map's own and never over
    /// them.
    pub(crate) fn add_to(self, headers: &mut HeaderMap) {
        // Decided against the map as it was, so that a name the target sent
        // twice (`Set-Cookie`) is relayed twice.
        let add: Vec<_> = self
            .fields()
            .filter(|(name, _)| !in_map(headers, name))
            .filter_map(|(name, value)| {
                // httparse checked both as these do: a failure cannot come
                // from a head the client accepted; such a field is dropped.
                let name = field_name(name).ok()?;
                let value = HeaderValue::from_maybe_shared(self.0.head.slice_ref(value)).ok()?;
                Some((name, value))
            })
            .collect();
        for (name, value) in add {
            headers.append(name, value);
        }
    }
}

/// Whether `map` holds a field named `name` (any case).
fn in_map(map: &HeaderMap, name: &[u8]) -> bool {
    map.keys().any(|k| {
        let k = k.as_str().as_bytes();
        k.len() == name.len() && k.eq_ignore_ascii_case(name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fields read from `head` the way the client records them.
    fn relayed(head: &'static str) -> RelayedFields {
        let mut at = Vec::new();
        let mut pos = 0u32;
        for line in head.split_inclusive("\r\n") {
            if let Some(colon) = line.find(':') {
                let (c, len) = (colon as u32, line.trim_end().len() as u32);
                at.push([pos, pos + c, pos + c + 2, pos + len]);
            }
            pos += line.len() as u32;
        }
        RelayedFields::new(Bytes::from_static(head.as_bytes()), at)
    }

    #[test]
    fn the_gateways_own_fields_win_and_repeated_names_are_kept() {
        let head = "Server: up\r\nX-Request-Id: theirs\r\nContent-Type: text/x\r\nSet-Cookie: a=1\r\nX-RateLimit-Limit: 5\r\nSet-Cookie: b=2\r\nDate: Tue\r\n";
        // The key service's own field in the map; the request id and the
        // rate-limit fields stamped.
        let mut map = HeaderMap::new();
        map.insert("content-type", HeaderValue::from_static("application/json"));
        let stamp = || {
            crate::http_core::service::FixedStamp::new(&[
                ("x-request-id", "ours"),
                ("x-ratelimit-limit", "100"),
            ])
        };

        let mut out = Vec::new();
        let stamp_now = stamp();
        let stamped = crate::http_core::service::stamped_by(&stamp_now);
        assert!(relayed(head).write_to(&map, stamped, &mut out));
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "Server: up\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nDate: Tue\r\n"
        );

        let mut res =
            http::Response::new(crate::http_core::body::empty().relaying(Some(relayed(head))));
        *res.headers_mut() = map;
        let reply = crate::http_core::service::Reply {
            res,
            stamp: stamp(),
        };
        let mut res = reply.into_response();
        let h = res.headers();
        assert_eq!(h["x-request-id"], "ours");
        assert_eq!(h.get_all("x-request-id").iter().count(), 1);
        assert_eq!(h["x-ratelimit-limit"], "100");
        assert_eq!(h.get_all("x-ratelimit-limit").iter().count(), 1);
        assert_eq!(h["content-type"], "application/json");
        assert_eq!(h.get_all("content-type").iter().count(), 1);
        assert_eq!(h["server"], "up");
        let cookies: Vec<_> = h.get_all("set-cookie").iter().collect();
        assert_eq!(cookies, ["a=1", "b=2"]);
        assert!(res.body_mut().take_relayed().is_none());
    }

    #[test]
    fn no_date_among_them_is_reported() {
        let mut out = Vec::new();
        assert!(!relayed("Server: up\r\n").write_to(&HeaderMap::new(), |_| false, &mut out));
    }
}
