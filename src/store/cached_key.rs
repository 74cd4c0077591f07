//! [`CachedApiKey`]: what the key cache keeps of an [`ApiKeyAuth`], the fields
//! authentication reads and nothing else, its strings in one allocation. A
//! cached key costs two allocations (this struct in its `Arc`, and its text)
//! instead of a full record's nine; its name, prefix, timestamps and
//! `replaced_by` are never read per request and are not kept.
use ipnet::IpNet;

use super::{ApiKeyAuth, Change, Credits, KeyStatus, LimitSpec, OrgLimit};

/// An API key as the hot path sees it (built from an [`ApiKeyAuth`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedApiKey {
    /// The key id, organization id, user id and role, then the scopes
    /// one space apart (scopes never hold whitespace).
    text: Box<str>,
    /// Where the key id, organization id, user id and role end in `text`.
    ends: [u32; 4],
    /// Expiry time (unix seconds), if any.
    expires_at: Option<i64>,
    /// Revoked (wins over expired).
    revoked: bool,
    /// The user is a member of the key's organization (`role` is meaningful).
    member: bool,
    /// The key's own limit, if it has one.
    rate_limit: Option<LimitSpec>,
    /// The organization's overrides of policy quotas (usually none: no allocation).
    org_limits: Box<[OrgLimit]>,
    /// The key's controls, when any differs from the default (usually
    /// none: no allocation, and one test of a pointer per request).
    controls: Option<Box<Controls>>,
}

/// The controls of a key that has any, as the hot path reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Controls {
    /// False: refused as `disabled`.
    pub enabled: bool,
    /// The networks the key works from; `None`: any.
    pub ip_allow: Option<Box<[IpNet]>>,
    /// `meta` as base64url (no padding) of its JSON text, ready for
    /// `X-Mpg-Key-Meta`.
    pub meta: Option<Box<str>>,
    /// The key's credits as the store last had them.
    pub credits: Option<Credits>,
    /// The key's creation time: refill periods count from it.
    pub created_at: i64,
}

impl CachedApiKey {
    /// The key id.
    pub fn id(&self) -> &str {
        self.part(0)
    }

    /// The organization the key acts for.
    pub fn organization_id(&self) -> &str {
        self.part(1)
    }

    /// The user who owns the key.
    pub fn user_id(&self) -> &str {
        self.part(2)
    }

    /// The user's current role in the key's organization (None: no member).
    pub fn role(&self) -> Option<&str> {
        self.member.then(|| self.part(3))
    }

    /// The key's scopes, space-separated.
    pub fn scopes(&self) -> &str {
        let start = self.ends[3] as usize;
        self.text.get(start..).unwrap_or_default()
    }

    /// Each scope, in the order given at creation.
    pub fn scope_list(&self) -> impl Iterator<Item = &str> {
        self.scopes().split_ascii_whitespace()
    }

    /// The key's status at `now` (unix seconds); revoked wins over expired.
    pub fn status(&self, now: i64) -> KeyStatus {
        if self.revoked {
            KeyStatus::Revoked
        } else if self.expires_at.is_some_and(|at| at <= now) {
            KeyStatus::Expired
        } else {
            KeyStatus::Active
        }
    }

    /// The key's own limit, if it has one.
    pub fn rate_limit(&self) -> Option<&LimitSpec> {
        self.rate_limit.as_ref()
    }

    /// The key's organization's overrides of policy quotas.
    pub fn org_limits(&self) -> &[OrgLimit] {
        &self.org_limits
    }

    /// The key's controls, if any differs from the default.
    #[inline]
    pub fn controls(&self) -> Option<&Controls> {
        self.controls.as_deref()
    }

    /// True when `change` may make this entry wrong.
    pub(crate) fn affected_by(&self, change: &Change) -> bool {
        match change {
            Change::ApiKey { id } => self.id() == id,
            Change::Member {
                organization_id,
                user_id,
            } => self.organization_id() == organization_id && self.user_id() == user_id,
            Change::Session { .. } => false,
            Change::OrgLimits { organization_id } => self.organization_id() == organization_id,
            Change::All => true,
        }
    }

    /// Part `i` of `text` (0: id, 1: organization, 2: user, 3: role).
    fn part(&self, i: usize) -> &str {
        let start = match i {
            0 => 0,
            _ => self.ends[i - 1] as usize,
        };
        self.text
            .get(start..self.ends[i] as usize)
            .unwrap_or_default()
    }
}

impl From<&ApiKeyAuth> for CachedApiKey {
    fn from(auth: &ApiKeyAuth) -> Self {
        let key = &auth.key;
        let role = auth.role.as_deref().unwrap_or_default();
        let scopes_len: usize = key.scopes.iter().map(|s| s.len() + 1).sum();
        let mut text = String::with_capacity(
            key.id.len() + key.organization_id.len() + key.user_id.len() + role.len() + scopes_len,
        );
        let mut ends = [0u32; 4];
        for (end, part) in
            ends.iter_mut()
                .zip([key.id.as_str(), &key.organization_id, &key.user_id, role])
        {
            text.push_str(part);
            *end = u32::try_from(text.len()).unwrap_or(u32::MAX);
        }
        // Only visible ASCII: the scopes are written into a header as they are kept, so
        // a hand-edited row holding spaces or control bytes cannot split or inject one.
        let visible = |s: &&String| !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic());
        for (i, scope) in key.scopes.iter().filter(visible).enumerate() {
            if i > 0 {
                text.push(' ');
            }
            text.push_str(scope);
        }
        CachedApiKey {
            text: text.into_boxed_str(),
            ends,
            expires_at: key.expires_at,
            revoked: key.revoked_at.is_some(),
            member: auth.role.is_some(),
            rate_limit: key.rate_limit,
            org_limits: auth.org_limits.clone().into_boxed_slice(),
            controls: controls(key),
        }
    }
}

/// The controls of `key` as cached: `None` when all are the defaults.
fn controls(key: &super::ApiKeyRecord) -> Option<Box<Controls>> {
    use base64::Engine as _;
    let c = &key.controls;
    if *c == super::KeyControls::default() {
        return None;
    }
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    Some(Box::new(Controls {
        enabled: c.enabled,
        ip_allow: c.ip_allow.clone().map(Vec::into_boxed_slice),
        meta: c.meta.as_ref().map(|m| b64.encode(m).into_boxed_str()),
        credits: c.credits,
        created_at: key.created_at,
    }))
}

#[cfg(test)]
mod tests;
