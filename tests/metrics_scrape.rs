//! The `/metrics` page as Prometheus reads it, and the deploy files that
//! read it: a gateway with a real upstream, Redis and its admin listener
//! serves a 200, a 401, a 429, a shadow refusal and an upstream failure;
//! then its page must pass `promtool check metrics`, describe every family,
//! and carry every metric and label that the Grafana dashboard
//! (`deploy/grafana/mpg-gateway.json`) and the alert rules
//! (`deploy/prometheus/alerts.yml`) name; and promtool must parse every
//! query of the dashboard (CI checks the rules file with promtool itself).
mod common;

use common::scale::{metrics, redis_url, RedisPrefix};
use common::*;
use mpg_gateway::metrics::{Kind, DESCRIPTIONS};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::process::{Command, Stdio};

const DASHBOARD: &str = include_str!("../deploy/grafana/mpg-gateway.json");
const ALERTS: &str = include_str!("../deploy/prometheus/alerts.yml");
const OPERATIONS: &str = include_str!("../docs/operations.md");

/// Labels Prometheus adds to every series it scrapes (`instance`, `job`), not
/// the gateway.
const TARGET_LABELS: [&str; 2] = ["instance", "job"];

#[tokio::test]
async fn the_scrape_passes_promtool_and_carries_what_the_dashboard_and_alerts_name() {
    let page = scrape_after_traffic().await;

    promtool_check_metrics(&page);
    let scrape = Scrape::parse(&page);
    for family in scrape.types.keys() {
        assert!(
            scrape.helped.contains(family),
            "{family} has no # HELP line:\n{page}"
        );
    }
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        page.contains(&format!("\nmpg_build_info{{version=\"{version}\"}} 1\n")),
        "{page}"
    );
    for family in [
        "process_resident_memory_bytes",
        "process_cpu_seconds_total",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        assert!(scrape.types.contains_key(family), "no {family}:\n{page}");
    }
    assert!(
        page.contains("\nmpg_trace_spans_dropped_total 0\n"),
        "{page}"
    );

    // The described labels are what the page shows: no series carries a
    // label its description leaves out, and a described family on the page
    // carries each of its labels on some series.
    let labels = known_labels(&scrape);
    for (family, seen) in &scrape.labels {
        let declared = labels
            .get(family.as_str())
            .unwrap_or_else(|| panic!("{family} is on the page but not described"));
        assert_eq!(seen, declared, "{family}: labels on the page vs described");
    }

    let mut exprs = dashboard_exprs();
    promtool_parses(&exprs);
    let alerts = alert_exprs();
    assert!(
        exprs.len() >= 30 && alerts.len() >= 6,
        "{exprs:?} {alerts:?}"
    );
    exprs.extend(alerts);
    let problems: Vec<String> = exprs
        .iter()
        .flat_map(|e| unknown_names(e, &labels))
        .collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_runbook_url_names_a_heading_of_operations_md() {
    let anchors: BTreeSet<String> = OPERATIONS
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| slug(l.trim_start_matches('#')))
        .collect();
    let urls: Vec<&str> = ALERTS
        .lines()
        .filter_map(|l| l.trim().strip_prefix("runbook_url:"))
        .map(str::trim)
        .collect();
    assert_eq!(urls.len(), alert_exprs().len(), "one runbook_url per alert");
    for url in urls {
        let anchor = url
            .strip_prefix("docs/operations.md#")
            .unwrap_or_else(|| panic!("{url} is not an anchor of docs/operations.md"));
        assert!(
            anchors.contains(anchor),
            "no heading #{anchor} in operations.md"
        );
    }
}

#[test]
fn names_and_labels_are_read_from_promql() {
    let r = refs(
        r#"histogram_quantile(0.99, sum by (le, upstream) (rate(mpg_upstream_duration_seconds_bucket{instance=~"$instance", upstream!="x{y}"}[$__rate_interval]))) / on (instance) group_left process_open_fds"#,
    );
    assert_eq!(
        r.metrics,
        ["mpg_upstream_duration_seconds_bucket", "process_open_fds"]
    );
    assert_eq!(
        r.selectors,
        [
            (
                "mpg_upstream_duration_seconds_bucket".into(),
                "instance".into()
            ),
            (
                "mpg_upstream_duration_seconds_bucket".into(),
                "upstream".into()
            )
        ]
    );
    assert_eq!(r.grouping, ["le", "upstream", "instance"]);
    let labels = BTreeMap::from([("mpg_upstream_duration_seconds", set(&["upstream"]))]);
    assert_eq!(
        unknown_names(
            "sum by (target) (rate(mpg_upstream_duration_seconds_count[5m])) + mpg_nope",
            &labels
        ),
        [
            "mpg_nope: no such metric (in `sum by (target) (rate(mpg_upstream_duration_seconds_count[5m])) + mpg_nope`)",
            "target: no metric of the expression has it (in `sum by (target) (rate(mpg_upstream_duration_seconds_count[5m])) + mpg_nope`)",
        ]
    );
}

// === the gateway, its traffic and its page ===

/// Starts a gateway (Redis limiter, a dead upstream, tight and shadow
/// policies), sends the traffic, and returns its `/metrics` page.
async fn scrape_after_traffic() -> String {
    let up = MockUpstream::start().await;
    // A port nothing listens on: connects are refused.
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    // Its keys are deleted when the scrape is done.
    let prefix = RedisPrefix::new();
    let mut cfg = TestConfig::new(up.addr);
    cfg.admin_on();
    cfg.redis(&redis_url(), &prefix.0);
    cfg.set("rate_limit.policies.tight.requests", 1);
    cfg.set("rate_limit.policies.tight.per", "1h");
    cfg.set("rate_limit.policies.tight.key", "client_ip");
    cfg.set("rate_limit.policies.watch.requests", 1);
    cfg.set("rate_limit.policies.watch.per", "1h");
    cfg.set("rate_limit.policies.watch.key", "client_ip");
    cfg.set("rate_limit.policies.watch.mode", "shadow");
    cfg.set("upstreams.dead.targets", vec![format!("http://{dead}")]);
    cfg.set("upstreams.dead.max_fails", 1);
    let open = |path: &str, upstream: &str, limit: &str| {
        format!("method = \"GET\"\npath = \"{path}\"\nauth = \"none\"\nupstream = \"{upstream}\"\nrate_limit = \"{limit}\"")
    };
    cfg.route(&open("/public/ping", "clusters", "none"));
    cfg.route(&open("/public/tight", "clusters", "tight"));
    cfg.route(&open("/public/watched", "clusters", "watch"));
    cfg.route(&open("/public/dead", "dead", "none"));
    let path = cfg.write();
    let seed = seed(&path, "acme", "alice", "owner", "clusters:read");
    let gw = Gateway::start(&path);
    let admin = gw.admin.expect("admin listener address logged");
    let c = client();
    let get = |path: &str| c.get(gw.url(path));

    for _ in 0..2 {
        let res = get("/api/v1/clusters?organization_id=acme")
            .bearer_auth(&seed.key)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), 200);
    }
    let res = get("/api/v1/clusters?organization_id=acme")
        .bearer_auth("mpg_not_a_key")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 401);
    let statuses = [
        get("/public/tight").send().await.unwrap().status(),
        get("/public/tight").send().await.unwrap().status(),
    ];
    assert_eq!(statuses.map(|s| s.as_u16()), [200, 429]);
    for _ in 0..2 {
        assert_eq!(get("/public/watched").send().await.unwrap().status(), 200);
    }
    assert_eq!(get("/public/dead").send().await.unwrap().status(), 502);
    assert_eq!(get("/nowhere").send().await.unwrap().status(), 404);

    metrics(admin).await
}

/// Runs `promtool check metrics` on `page`; fails on any problem it
/// reports.
fn promtool_check_metrics(page: &str) {
    if let Some((ok, said)) = promtool(&["check", "metrics"], page) {
        assert!(
            ok && said.trim().is_empty(),
            "promtool check metrics:\n{said}\n--- the page:\n{page}"
        );
    }
}

/// Has promtool parse the dashboard's queries, as recording rules with
/// Grafana's variables given values: a query Prometheus cannot parse fails.
fn promtool_parses(exprs: &[String]) {
    let mut rules = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, expr) in exprs.iter().enumerate() {
        let expr = expr
            .replace("$__rate_interval", "5m")
            .replace("$instance", ".*")
            .replace("$route", ".*");
        // A JSON string is a YAML double-quoted scalar.
        let expr = serde_json::to_string(&expr).unwrap();
        rules.push_str(&format!(
            "      - record: dashboard:{i}\n        expr: {expr}\n"
        ));
    }
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("dashboard.yml");
    std::fs::write(&file, &rules).unwrap();
    if let Some((ok, said)) = promtool(&["check", "rules", file.to_str().unwrap()], "") {
        assert!(
            ok,
            "promtool check rules (the dashboard's queries):\n{said}\n{rules}"
        );
    }
}

/// Runs promtool with `input` on its standard input: whether it succeeded,
/// and what it said. Without promtool the test fails (CI installs it),
/// unless `MPG_SKIP_PROMTOOL=1`: then `None`.
fn promtool(args: &[&str], input: &str) -> Option<(bool, String)> {
    let child = Command::new("promtool")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if std::env::var("MPG_SKIP_PROMTOOL").as_deref() == Ok("1") {
                eprintln!("promtool not found; `promtool {args:?}` skipped (MPG_SKIP_PROMTOOL=1)");
                return None;
            }
            panic!(
                "promtool not found: install the `prometheus` package (apt-get install \
                 prometheus; CI does), or set MPG_SKIP_PROMTOOL=1 to skip this check"
            );
        }
        Err(e) => panic!("promtool: {e}"),
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some((out.status.success(), said))
}

/// What a page says: each family's type, which families have `# HELP`, and
/// the label names each family's series carry (`le` and `quantile` left out).
struct Scrape {
    types: BTreeMap<String, String>,
    helped: BTreeSet<String>,
    labels: BTreeMap<String, BTreeSet<String>>,
}

impl Scrape {
    fn parse(page: &str) -> Scrape {
        let mut s = Scrape {
            types: BTreeMap::new(),
            helped: BTreeSet::new(),
            labels: BTreeMap::new(),
        };
        for line in page.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                s.types.insert(name.into(), kind.into());
            } else if let Some(rest) = line.strip_prefix("# HELP ") {
                s.helped.insert(rest.split(' ').next().unwrap().into());
            }
        }
        for line in page
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
        {
            let name_end = line.find(['{', ' ']).unwrap();
            let name = &line[..name_end];
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .filter_map(|suffix| name.strip_suffix(suffix))
                .find(|base| s.types.get(*base).is_some_and(|k| k == "histogram"))
                .unwrap_or(name);
            assert!(s.types.contains_key(family), "{line}: no # TYPE");
            let labels = s.labels.entry(family.into()).or_default();
            if line[name_end..].starts_with('{') {
                for label in label_names(&line[name_end..]) {
                    if label != "le" && label != "quantile" {
                        labels.insert(label);
                    }
                }
            }
        }
        s
    }
}

/// The label names of a series' `{a="x",b="y"}`, values skipped with
/// their escapes (a route template holds braces).
fn label_names(selector: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut chars = selector[1..].chars();
    let mut name = String::new();
    while let Some(c) = chars.next() {
        match c {
            '}' => break,
            '=' => {
                names.push(std::mem::take(&mut name));
                assert_eq!(chars.next(), Some('"'), "{selector}");
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => {
                            chars.next();
                        }
                        '"' => break,
                        _ => {}
                    }
                }
            }
            ',' => {}
            c => name.push(c),
        }
    }
    names
}

/// Every metric a query may name, with the labels it may carry: the
/// described ones (whether or not this run made their series) and the
/// families on the page that no description covers (`process_*`).
fn known_labels(scrape: &Scrape) -> BTreeMap<&str, BTreeSet<String>> {
    let mut known: BTreeMap<&str, BTreeSet<String>> = DESCRIPTIONS
        .iter()
        .map(|d| (d.name, d.labels.iter().map(|l| l.to_string()).collect()))
        .collect();
    for (family, kind) in &scrape.types {
        if let Some(d) = DESCRIPTIONS.iter().find(|d| d.name == family) {
            let expected = match d.kind {
                Kind::Counter => "counter",
                Kind::Gauge => "gauge",
                Kind::Histogram => "histogram",
            };
            assert_eq!(kind, expected, "{family}");
        } else {
            assert!(family.starts_with("process_"), "{family} is not described");
            let labels = scrape.labels.get(family).cloned().unwrap_or_default();
            known.insert(family.as_str(), labels);
        }
    }
    known
}

// === the deploy files' queries ===

/// Every PromQL expression of the dashboard: its panels' targets (rows'
/// panels too) and its query variables.
fn dashboard_exprs() -> Vec<String> {
    let dash: serde_json::Value = serde_json::from_str(DASHBOARD).expect("dashboard JSON");
    assert_eq!(dash["schemaVersion"], 39);
    let mut exprs = Vec::new();
    let mut panels: Vec<&serde_json::Value> = dash["panels"].as_array().unwrap().iter().collect();
    while let Some(panel) = panels.pop() {
        if let Some(inner) = panel["panels"].as_array() {
            panels.extend(inner);
        }
        for target in panel["targets"].as_array().into_iter().flatten() {
            exprs.push(
                target["expr"]
                    .as_str()
                    .expect("a target's expr")
                    .to_string(),
            );
        }
    }
    for var in dash["templating"]["list"].as_array().unwrap() {
        if var["type"] != "query" {
            continue;
        }
        let query = var["query"]["query"].as_str().or(var["query"].as_str());
        let query = query.expect("a variable's query");
        // label_values(selector, label): the label is grouped by, in effect.
        let inner = query
            .strip_prefix("label_values(")
            .and_then(|q| q.strip_suffix(')'))
            .expect("label_values(…) variables only");
        let (selector, label) = inner.rsplit_once(',').unwrap();
        exprs.push(format!("sum by ({}) ({selector})", label.trim()));
    }
    exprs
}

/// Every `expr` of the alert rules, folded (`>-`) ones joined into a line.
fn alert_exprs() -> Vec<String> {
    let lines: Vec<&str> = ALERTS.lines().collect();
    let mut exprs = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = line.trim_start().strip_prefix("expr:") else {
            continue;
        };
        let rest = rest.trim();
        if !matches!(rest, ">-" | ">" | "|" | "|-") {
            exprs.push(rest.to_string());
            continue;
        }
        let indent = line.len() - line.trim_start().len();
        let body: Vec<&str> = lines[i + 1..]
            .iter()
            .take_while(|l| l.len() - l.trim_start().len() > indent)
            .map(|l| l.trim())
            .collect();
        exprs.push(body.join(" "));
    }
    let alerts = lines
        .iter()
        .filter(|l| l.trim_start().starts_with("- alert:"))
        .count();
    assert_eq!(exprs.len(), alerts, "one expr per alert");
    exprs
}

/// What an expression names: metrics (`mpg_*`, `process_*`), the labels in
/// each metric's `{…}` selector, and the labels of its `by`, `without`,
/// `on`, `ignoring` and `group_*` clauses.
#[derive(Debug, Default)]
struct Refs {
    metrics: Vec<String>,
    selectors: Vec<(String, String)>,
    grouping: Vec<String>,
}

fn refs(expr: &str) -> Refs {
    let b = expr.as_bytes();
    let mut r = Refs::default();
    let mut i = 0;
    let ident = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && (b[*i].is_ascii_alphanumeric() || b[*i] == b'_') {
            *i += 1;
        }
        expr[start..*i].to_string()
    };
    let skip_space = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    // Past a quoted string starting at `i`.
    let skip_string = |i: &mut usize| {
        let quote = b[*i];
        *i += 1;
        while *i < b.len() && b[*i] != quote {
            *i += if b[*i] == b'\\' { 2 } else { 1 };
        }
        *i += 1;
    };
    while i < b.len() {
        match b[i] {
            b'"' | b'\'' | b'`' => skip_string(&mut i),
            b'[' => i += expr[i..].find(']').unwrap_or(b.len() - i),
            // A Grafana variable: $name, ${name}.
            b'$' => {
                i += 1;
                if b.get(i) == Some(&b'{') {
                    i += expr[i..].find('}').unwrap() + 1;
                } else {
                    ident(&mut i);
                }
            }
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let word = ident(&mut i);
                skip_space(&mut i);
                let clause = [
                    "by",
                    "without",
                    "on",
                    "ignoring",
                    "group_left",
                    "group_right",
                ];
                if clause.contains(&word.as_str()) && b.get(i) == Some(&b'(') {
                    let end = i + expr[i..].find(')').unwrap();
                    r.grouping.extend(
                        expr[i + 1..end]
                            .split(',')
                            .map(str::trim)
                            .filter(|l| !l.is_empty())
                            .map(String::from),
                    );
                    i = end + 1;
                } else if word.starts_with("mpg_") || word.starts_with("process_") {
                    if b.get(i) == Some(&b'{') {
                        i += 1;
                        while i < b.len() && b[i] != b'}' {
                            match b[i] {
                                b'"' | b'\'' | b'`' => skip_string(&mut i),
                                c if c.is_ascii_alphabetic() || c == b'_' => {
                                    let label = ident(&mut i);
                                    r.selectors.push((word.clone(), label));
                                }
                                _ => i += 1,
                            }
                        }
                    }
                    r.metrics.push(word);
                }
            }
            _ => i += 1,
        }
    }
    r
}

/// The metrics and labels `expr` names that the gateway does not expose,
/// one line each.
fn unknown_names(expr: &str, known: &BTreeMap<&str, BTreeSet<String>>) -> Vec<String> {
    let r = refs(expr);
    let mut problems = Vec::new();
    let mut in_expr = BTreeSet::new();
    let mut le_allowed = false;
    // A histogram's series, named by family.
    let family = |m: &str| -> Option<(String, bool)> {
        if known.contains_key(m) {
            return Some((m.to_string(), false));
        }
        ["_bucket", "_sum", "_count"].iter().find_map(|s| {
            let base = m.strip_suffix(s)?;
            let histogram = DESCRIPTIONS
                .iter()
                .any(|d| d.name == base && d.kind == Kind::Histogram);
            histogram.then(|| (base.to_string(), *s == "_bucket"))
        })
    };
    for m in &r.metrics {
        match family(m) {
            Some((f, bucket)) => {
                le_allowed |= bucket;
                in_expr.extend(known[f.as_str()].iter().cloned());
            }
            None => problems.push(format!("{m}: no such metric (in `{expr}`)")),
        }
    }
    for (m, label) in &r.selectors {
        let Some((f, bucket)) = family(m) else {
            continue;
        };
        let ok = known[f.as_str()].contains(label)
            || TARGET_LABELS.contains(&label.as_str())
            || (bucket && label == "le");
        if !ok {
            problems.push(format!("{m}{{{label}}}: no such label (in `{expr}`)"));
        }
    }
    for label in &r.grouping {
        let ok = in_expr.contains(label)
            || TARGET_LABELS.contains(&label.as_str())
            || (le_allowed && label == "le");
        if !ok {
            problems.push(format!(
                "{label}: no metric of the expression has it (in `{expr}`)"
            ));
        }
    }
    problems
}

/// A heading's anchor as GitHub makes it.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn set(labels: &[&str]) -> BTreeSet<String> {
    labels.iter().map(|l| l.to_string()).collect()
}
