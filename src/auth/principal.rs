//! Who a request is from, once authenticated, and what they may do in an
//! organization: key scopes ∩ the permissions of the user's *current* role
//! (the pipeline's authorization stage).
use std::sync::Arc;

use crate::config::{Permissions, Roles};
use crate::store::{CachedApiKey, SessionAuth};

/// An authenticated caller (a cached store entry, shared, not copied).
#[derive(Debug, Clone)]
pub enum Principal {
    /// `Authorization: Bearer mpg_…`
    ApiKey(Arc<CachedApiKey>),
    /// `Authorization: Bearer mps_…`
    Session(Arc<SessionAuth>),
}

impl Principal {
    /// `X-Mpg-Auth`.
    pub fn auth_kind(&self) -> &'static str {
        match self {
            Principal::ApiKey(_) => "api_key",
            Principal::Session(_) => "session",
        }
    }

    /// The user behind the credential.
    pub fn user_id(&self) -> &str {
        match self {
            Principal::ApiKey(k) => k.user_id(),
            Principal::Session(s) => &s.session.user_id,
        }
    }

    /// The API key id, for keys.
    pub fn key_id(&self) -> Option<&str> {
        match self {
            Principal::ApiKey(k) => Some(k.id()),
            Principal::Session(_) => None,
        }
    }

    /// An API key's `meta` as base64url (for `X-Mpg-Key-Meta`), if it has one.
    pub fn key_meta(&self) -> Option<&[u8]> {
        match self {
            Principal::ApiKey(k) => k.controls()?.meta.as_deref().map(str::as_bytes),
            Principal::Session(_) => None,
        }
    }

    /// The organization an API key belongs to (sessions have none of their own).
    pub fn home_organization(&self) -> Option<&str> {
        match self {
            Principal::ApiKey(k) => Some(k.organization_id()),
            Principal::Session(_) => None,
        }
    }

    /// The user's current role in `org`; `None` = not a member (or, for a key,
    /// another organization than the key's).
    pub fn role_in(&self, org: &str) -> Option<&str> {
        match self {
            Principal::ApiKey(k) if k.organization_id() == org => k.role(),
            Principal::ApiKey(_) => None,
            Principal::Session(s) => s.role_in(org),
        }
    }

    /// Whether the caller, acting with `role`, holds `scope`.
    pub fn allows(&self, roles: &Roles, role: &str, scope: &str) -> bool {
        let scoped = match self {
            Principal::ApiKey(k) => k.scope_list().any(|s| s == scope),
            Principal::Session(_) => true,
        };
        scoped && roles.allows(role, scope)
    }

    /// Effective permissions for `X-Mpg-Scopes`, acting with `role`: one
    /// lookup of the role, nothing collected.
    pub fn effective_scopes<'a>(&'a self, roles: &'a Roles, role: &str) -> Scopes<'a> {
        let permissions = roles.permissions(role);
        let none = Scopes::listed(&[]);
        match (self, permissions) {
            (_, None) => none,
            (Principal::ApiKey(k), Some(Permissions::All)) => Scopes {
                words: k.scopes(),
                ..none
            },
            (Principal::ApiKey(k), Some(Permissions::Only(list))) => Scopes {
                words: k.scopes(),
                keep: Some(&list[..]),
                ..none
            },
            (Principal::Session(_), Some(Permissions::All)) => Scopes { star: true, ..none },
            (Principal::Session(_), Some(Permissions::Only(list))) => Scopes::listed(list),
        }
    }
}

/// A caller's effective permissions: a key's scopes that its role grants,
/// or a session's role's permissions (`*` for all). Written out
/// space-separated where the header is written ([`Scopes::fill`]).
#[derive(Debug, Clone, Copy)]
pub struct Scopes<'a> {
    items: &'a [String],
    /// More items, space-separated (a cached key's scopes).
    words: &'a str,
    /// Only the items in this list count (a key's scopes ∩ its role's).
    keep: Option<&'a [String]>,
    /// All permissions: `*`.
    star: bool,
}

impl<'a> Scopes<'a> {
    /// Exactly the permissions in `items`.
    pub fn listed(items: &'a [String]) -> Self {
        Scopes {
            items,
            words: "",
            keep: None,
            star: false,
        }
    }

    /// Each permission, in order.
    pub fn iter(&self) -> impl Iterator<Item = &'a str> + 'a {
        let keep = self.keep;
        let star = self.star.then_some("*");
        let items = self.items.iter().map(String::as_str);
        star.into_iter().chain(
            items
                .chain(self.words.split_ascii_whitespace())
                .filter(move |s| keep.is_none_or(|list| list.iter().any(|k| k == s))),
        )
    }

    /// The permissions space-separated, as pieces in order.
    fn pieces(&self, mut put: impl FnMut(&[u8])) {
        // A key's scopes, all kept: already written out, one space apart.
        if !self.star && self.items.is_empty() && self.keep.is_none() {
            put(self.words.as_bytes());
            return;
        }
        for (i, s) in self.iter().enumerate() {
            if i > 0 {
                put(b" ");
            }
            put(s.as_bytes());
        }
    }

    /// Writes the permissions, space-separated, at the start of `buf`;
    /// their length, or `None` if they do not fit.
    pub fn fill(&self, buf: &mut [u8]) -> Option<usize> {
        let mut n = Some(0);
        self.pieces(|piece| {
            n = n.and_then(|at| {
                let end = at + piece.len();
                buf.get_mut(at..end)?.copy_from_slice(piece);
                Some(end)
            });
        });
        n
    }

    /// The permissions, space-separated.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.pieces(|piece| out.extend_from_slice(piece));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_write_as_a_space_separated_list_or_say_they_do_not_fit() {
        let items: Vec<String> = vec!["a:read".into(), "b:write".into(), "c:read".into()];
        let keep: Vec<String> = vec!["c:read".into(), "a:read".into()];
        let all = Scopes::listed(&items);
        let kept = Scopes {
            keep: Some(&keep),
            ..all
        };
        let star = Scopes {
            star: true,
            ..Scopes::listed(&[])
        };
        let words = Scopes {
            words: "a:read b:write c:read",
            ..Scopes::listed(&[])
        };
        let kept_words = Scopes {
            keep: Some(&keep),
            ..words
        };
        let mut buf = [0u8; 64];
        for (scopes, want) in [
            (all, "a:read b:write c:read"),
            (kept, "a:read c:read"),
            (star, "*"),
            (words, "a:read b:write c:read"),
            (kept_words, "a:read c:read"),
            (Scopes::listed(&[]), ""),
        ] {
            assert_eq!(scopes.to_vec(), want.as_bytes());
            let n = scopes.fill(&mut buf).unwrap();
            assert_eq!(&buf[..n], want.as_bytes());
        }
        assert_eq!(all.fill(&mut buf[..20]), None);
        assert_eq!(all.fill(&mut buf[..21]), Some(21));
    }
}
