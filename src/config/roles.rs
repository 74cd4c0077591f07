//! `[roles]`: the default roles, and the check that every permission a role
//! lists is a scope something knows.
use std::collections::{BTreeMap, BTreeSet};

use super::problems::Problems;
use super::{Permissions, Roles};

pub(super) fn default_roles() -> BTreeMap<String, Vec<String>> {
    let list = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    BTreeMap::from([
        ("owner".into(), list(&["*"])),
        ("admin".into(), list(&["*"])),
        (
            "member".into(),
            list(&[
                "clusters:read",
                "clusters:write",
                "api-keys:read",
                "api-keys:write",
            ]),
        ),
        ("viewer".into(), list(&["clusters:read", "api-keys:read"])),
    ])
}

pub(super) fn roles_settings(
    p: &mut Problems,
    raw: &BTreeMap<String, Vec<String>>,
    known: &BTreeSet<String>,
) -> Roles {
    let mut map = foldhash::HashMap::default();
    for (role, perms) in raw {
        let path = format!("roles.{role}");
        if perms.iter().any(|x| x == "*") {
            if perms.len() > 1 {
                p.add(&path, "\"*\" already grants everything; list nothing else");
            }
            map.insert(role.clone(), Permissions::All);
            continue;
        }
        for (i, perm) in perms.iter().enumerate() {
            if !known.contains(perm) {
                let all: Vec<&str> = known.iter().map(String::as_str).collect();
                p.add(
                    format!("{path}[{i}]"),
                    format!("unknown permission {perm:?}; known: {}", all.join(", ")),
                );
            }
        }
        map.insert(role.clone(), Permissions::Only(perms.clone()));
    }
    Roles { map }
}
