//! What the demo prints once it serves: what it seeded, and `curl` lines
//! that show each kind of answer when pasted in order (tests/demo.rs runs
//! them as printed).
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use crate::config::{format_duration, QuotaSettings};

/// The seeded credentials the lines use.
pub(super) struct Seeded {
    /// alice's session token.
    pub(super) session: String,
    /// An API key with `clusters:read` and `clusters:write`.
    pub(super) write_key: String,
    /// An API key with `clusters:read` only.
    pub(super) read_key: String,
    /// The read-only key's id (for the revoke line).
    pub(super) read_key_id: String,
}

/// What the lines describe besides the credentials.
pub(super) struct Serving<'a> {
    /// Where the gateway listens.
    pub(super) addr: SocketAddr,
    /// The file the routes came from, when not the shipped one.
    pub(super) config: Option<&'a Path>,
    /// How long a created or updated cluster is busy.
    pub(super) busy_for: Duration,
    /// The rate limit of `GET /clusters`, if it has one.
    pub(super) limit: Option<QuotaSettings>,
}

/// Prints the welcome to stdout.
pub(super) fn print(serving: &Serving<'_>, s: &Seeded) {
    println!("{}", text(serving, s));
}

fn text(serving: &Serving<'_>, s: &Seeded) -> String {
    let addr = serving.addr;
    let routes = match serving.config {
        Some(path) => format!("the routes, roles and policies of {}", path.display()),
        None => "the shipped routes (config/gateway.toml)".to_string(),
    };
    let base = format!("https://{addr}/api/v1");
    let acme = "organization_id=acme";
    let busy = format_duration(serving.busy_for);
    // Whole seconds to wait out a change, so that the lines pasted in order
    // delete a cluster that is running again (`sleep` takes whole seconds).
    let wait = serving.busy_for.as_secs() + u64::from(serving.busy_for.subsec_nanos() > 0);
    // Half as many requests again as the bucket holds, so that the loop outruns
    // the refill even when each curl takes a while.
    let flood = match serving.limit {
        Some(q) => format!(
            r#"
# GET /clusters allows {n} requests per {per}; past that, 429 with Retry-After:
for i in $(seq {count}); do curl -sk -o /dev/null -D - -H 'Authorization: Bearer {rw}' \
     '{base}/clusters?{acme}' | grep -i -e '^HTTP' -e '^retry-after'; done | sort | uniq -c
"#,
            n = q.requests,
            per = format_duration(q.per),
            count = q.requests.get().saturating_add(q.requests.get() / 2 + 10),
            rw = s.write_key,
        ),
        None => String::new(),
    };
    format!(
        r#"mpg-gateway demo is running on {addr} (self-signed TLS; embedded SQLite in a temp dir).
It serves {routes}, with an in-process clusters service.
Seeded: organization acme with two clusters; user alice (owner) with a session token, a
read-write API key (clusters:read, clusters:write) and a read-only one (clusters:read).

# List the clusters with the read-only key, and get one:
curl -k -H 'Authorization: Bearer {ro}' '{base}/clusters?{acme}'
curl -k -H 'Authorization: Bearer {ro}' '{base}/clusters/cl_demo_primary?{acme}'

# The same key for another organization is a 404; no key is a 401:
curl -k -H 'Authorization: Bearer {ro}' '{base}/clusters?organization_id=other'
curl -k '{base}/clusters?{acme}'

# The read-only key may not write: 403 naming the permission it lacks:
curl -k -X DELETE -H 'Authorization: Bearer {ro}' '{base}/clusters/cl_demo_analytics?{acme}'

# Create a cluster with the read-write key: 201, and "provisioning" for {busy}.
# The shell keeps its id in $ID for the lines below:
ID=$(curl -sk -X POST -H 'Authorization: Bearer {rw}' -H 'Content-Type: application/json' \
     -d '{{"name":"reports"}}' '{base}/clusters?{acme}' | tee /dev/stderr | sed -n 's/.*"id":"\([^"]*\)".*/\1/p')

# Change it at once: 409 with Retry-After while it is provisioning (later: 200, "updating"):
curl -k -i -X PATCH -H 'Authorization: Bearer {rw}' -H 'Content-Type: application/json' \
     -d '{{"plan":"large"}}' "{base}/clusters/$ID?{acme}"

# Bad input is a 400 naming the field:
curl -k -X POST -H 'Authorization: Bearer {rw}' -H 'Content-Type: application/json' \
     -d '{{"name":"Reports!"}}' '{base}/clusters?{acme}'

# Delete it once it is running again (a 409 until then): wait out its {busy}, then 204:
sleep {wait}
curl -k -i -X DELETE -H 'Authorization: Bearer {rw}' "{base}/clusters/$ID?{acme}"

# Manage keys with the session token: list, create, and revoke the read-only key,
# which then gets 401 with reason "revoked":
curl -k -H 'Authorization: Bearer {session}' '{base}/api-keys?{acme}'
curl -k -X POST -H 'Authorization: Bearer {session}' -H 'Content-Type: application/json' \
     -d '{{"name":"ci","scopes":["clusters:read"]}}' '{base}/api-keys?{acme}'
curl -k -X POST -H 'Authorization: Bearer {session}' '{base}/api-keys/{ro_id}/revoke'
curl -k -H 'Authorization: Bearer {ro}' '{base}/clusters?{acme}'
{flood}
Press Ctrl-C to stop."#,
        ro = s.read_key,
        rw = s.write_key,
        session = s.session,
        ro_id = s.read_key_id,
    )
}
