use super::*;
use crate::store::ApiKeyRecord;

fn auth(scopes: &[&str], role: Option<&str>) -> ApiKeyAuth {
    ApiKeyAuth {
        key: ApiKeyRecord {
            scopes: scopes.iter().map(|s| (*s).to_owned()).collect(),
            ..crate::store::testing::api_key_record()
        },
        role: role.map(str::to_owned),
        org_limits: Vec::new(),
    }
}

#[test]
fn keeps_what_authentication_reads() {
    let a = auth(&["clusters:read", "clusters:write"], Some("admin"));
    let k = CachedApiKey::from(&a);
    assert_eq!(k.id(), "key_abc");
    assert_eq!(k.organization_id(), "acme");
    assert_eq!(k.user_id(), "alice");
    assert_eq!(k.role(), Some("admin"));
    assert_eq!(k.scopes(), "clusters:read clusters:write");
    assert_eq!(
        k.scope_list().collect::<Vec<_>>(),
        ["clusters:read", "clusters:write"]
    );
    for now in [0, 99, 100, 200] {
        assert_eq!(k.status(now), a.key.status(now), "{now}");
    }
}

#[test]
fn no_role_no_scopes_and_revoked() {
    let mut a = auth(&[], None);
    a.key.revoked_at = Some(5);
    let k = CachedApiKey::from(&a);
    assert_eq!(k.role(), None);
    assert_eq!(k.scopes(), "");
    assert_eq!(k.scope_list().count(), 0);
    assert_eq!(k.status(0), KeyStatus::Revoked);
    // A member with an empty role name is still a member.
    let k = CachedApiKey::from(&auth(&["a"], Some("")));
    assert_eq!(k.role(), Some(""));
    assert_eq!(k.scopes(), "a");
}

#[test]
fn affected_by_its_id_and_its_membership_only() {
    let k = CachedApiKey::from(&auth(&["a"], Some("admin")));
    let key = |id: &str| Change::ApiKey { id: id.into() };
    let member = |o: &str, u: &str| Change::Member {
        organization_id: o.into(),
        user_id: u.into(),
    };
    assert!(k.affected_by(&key("key_abc")));
    assert!(!k.affected_by(&key("key_ab")));
    assert!(k.affected_by(&member("acme", "alice")));
    assert!(!k.affected_by(&member("acme", "bob")));
    assert!(!k.affected_by(&member("acm", "alice")));
    assert!(!k.affected_by(&Change::Session {
        id: "key_abc".into()
    }));
    assert!(k.affected_by(&Change::All));
}

#[test]
fn stays_small() {
    // The map holds an `Arc` of it per cached key: its size is paid 100 000 times.
    assert!(std::mem::size_of::<CachedApiKey>() <= 104);
}

#[test]
fn keeps_the_keys_own_limit_and_its_organizations_overrides() {
    let mut a = auth(&["a"], Some("admin"));
    assert_eq!(CachedApiKey::from(&a).rate_limit(), None);
    assert!(CachedApiKey::from(&a).org_limits().is_empty());
    let own = LimitSpec::parse(10, "1m").unwrap();
    let plan = OrgLimit {
        organization_id: "acme".into(),
        policy: "per_key".into(),
        limit: LimitSpec::parse(1000, "1m").unwrap(),
    };
    a.key.rate_limit = Some(own);
    a.org_limits = vec![plan.clone()];
    let k = CachedApiKey::from(&a);
    assert_eq!(k.rate_limit(), Some(&own));
    assert_eq!(k.org_limits(), [plan]);
}

#[test]
fn scopes_with_spaces_or_control_bytes_are_not_kept() {
    let k = CachedApiKey::from(&auth(
        &["a:read", "b c", "", "d\r\nX-Evil: 1", "e:write"],
        None,
    ));
    assert_eq!(k.scopes(), "a:read e:write");
    assert_eq!(k.scope_list().collect::<Vec<_>>(), ["a:read", "e:write"]);
}
