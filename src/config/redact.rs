//! Store and Redis URLs as they may be shown: in log lines, `migrate`'s
//! output and config errors, never with a secret in them.
//!
//! The rule: the password of `scheme://user:password@host` is hidden, and so
//! is the value of every query parameter whose name (percent-decoded, in any
//! case) contains one of [`SECRET_WORDS`] (`password`, `sslpassword`,
//! `passfile`, `auth_token`, `sslkey`, `client_secret` …). It errs on the side
//! of hiding: a file path in `sslkey` is hidden too, which costs an operator
//! a look at the config file, where a shown secret could not be taken back.
//! Text that is not a URL (a `key=value` connection string) is hidden whole
//! as soon as a secret-like name appears in it.

/// A query parameter whose lower-cased name contains one of these holds a secret.
const SECRET_WORDS: [&str; 8] = [
    "pass",
    "pwd",
    "secret",
    "token",
    "key",
    "auth",
    "credential",
    "signature",
];

/// What replaces a hidden value.
const HIDDEN: &str = "***";

/// Whether a parameter named `name` (as written, maybe percent-encoded)
/// holds a secret.
fn is_secret_name(name: &str) -> bool {
    let name = percent_decoded(name).to_ascii_lowercase();
    SECRET_WORDS.iter().any(|w| name.contains(w))
}

/// `text` with every valid `%XX` decoded (bytes that are not UTF-8 are replaced).
fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `url` with its user-info password and every secret-like query parameter's
/// value replaced by `***` (see the module doc for the rule).
pub(crate) fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return redact_dsn(url);
    };
    let (head, rest) = url.split_at(scheme_end + 3);
    let mut out = String::with_capacity(url.len());
    out.push_str(head);
    // URL parsers take the *last* `@` as the end of the user info, so a
    // password holding a raw `@`, `/` or `?` still ends there. Without a `:`
    // before it there is no password: the user info, if any, then ends at
    // the first `@`, unless a `/`, `?` or `#` comes first (the `@` is then in
    // the path or query, which is redacted below).
    let (userinfo, rest) = match rest.rfind('@') {
        Some(at) if rest[..at].contains(':') => (Some(&rest[..at]), &rest[at + 1..]),
        _ => match rest.find('@') {
            Some(at) if !rest[..at].contains(['/', '?', '#']) => {
                (Some(&rest[..at]), &rest[at + 1..])
            }
            _ => (None, rest),
        },
    };
    if let Some(userinfo) = userinfo {
        match userinfo.split_once(':') {
            Some((user, _)) => {
                out.push_str(user);
                out.push(':');
                out.push_str(HIDDEN);
            }
            None => out.push_str(userinfo),
        }
        out.push('@');
    }
    let Some((path, query)) = rest.split_once('?') else {
        out.push_str(rest);
        return out;
    };
    out.push_str(path);
    out.push('?');
    for (i, pair) in query.split('&').enumerate() {
        if i > 0 {
            out.push('&');
        }
        match pair.split_once('=') {
            Some((name, _)) if is_secret_name(name) => {
                out.push_str(name);
                out.push('=');
                out.push_str(HIDDEN);
            }
            _ => out.push_str(pair),
        }
    }
    out
}

/// Text without a scheme, e.g. `host=db password=x`: its quoting rules vary
/// by client, so it is hidden whole once a secret-like `name=` appears.
fn redact_dsn(text: &str) -> String {
    let secret = text
        .split(|c: char| c.is_whitespace() || c == '&' || c == '?' || c == ';')
        .filter_map(|token| token.split_once('=').map(|(name, _)| name))
        .any(is_secret_name);
    if secret {
        HIDDEN.to_owned()
    } else {
        text.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_secret_like_query_parameter_is_hidden() {
        for (url, shown) in [
            (
                "postgres://gw@db/g?sslpassword=hunter2&sslmode=require",
                "postgres://gw@db/g?sslpassword=***&sslmode=require",
            ),
            (
                "postgres://db/g?application_name=gw&PassWord=hunter2",
                "postgres://db/g?application_name=gw&PassWord=***",
            ),
            (
                "postgres://db/g?pass%77ord=hunter2",
                "postgres://db/g?pass%77ord=***",
            ),
            (
                "redis://cache:6379/0?auth_token=hunter2&db=1",
                "redis://cache:6379/0?auth_token=***&db=1",
            ),
            (
                "postgres://db/g?client_secret=hunter2&api_key=hunter3&pwd=hunter4",
                "postgres://db/g?client_secret=***&api_key=***&pwd=***",
            ),
            (
                "postgres://db/g?sslkey=/etc/k.pem&sslcert=/etc/c.pem",
                "postgres://db/g?sslkey=***&sslcert=/etc/c.pem",
            ),
            (
                "postgres://db/g?passfile=/home/gw/.pgpass",
                "postgres://db/g?passfile=***",
            ),
        ] {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }

    #[test]
    fn parameters_that_hold_no_secret_are_shown() {
        for url in [
            "postgres://gw@db.internal:5432/gateway?sslmode=require&application_name=gw",
            "postgres://db/g?connect_timeout=5&options=-c%20statement_timeout%3D5s",
            "redis://cache:6379/0",
            "postgres://db/g?flag",
        ] {
            assert_eq!(redact_url(url), url);
        }
    }

    #[test]
    fn an_at_sign_in_the_query_does_not_expose_the_query() {
        for (url, shown) in [
            (
                "postgres://db/g?password=a@b",
                "postgres://db/g?password=***",
            ),
            (
                "postgres://gw@db/g?password=a@b",
                "postgres://gw@db/g?password=***",
            ),
            // A port before the `@`: more is hidden than needed, never less.
            ("postgres://db:5432/g?password=a@b", "postgres://db:***@b"),
        ] {
            let got = redact_url(url);
            assert_eq!(got, shown, "{url}");
            assert!(!got.contains("=a"), "{got}");
        }
    }

    #[test]
    fn the_user_info_password_is_hidden() {
        assert_eq!(
            redact_url("redis://:hunter2@cache:6379"),
            "redis://:***@cache:6379"
        );
        assert_eq!(
            redact_url("postgres://gw:p@ss/w?rd@db/g?password=x"),
            "postgres://gw:***@db/g?password=***"
        );
    }

    #[test]
    fn a_connection_string_with_a_secret_is_hidden_whole() {
        assert_eq!(redact_url("host=db user=gw password=hunter2"), "***");
        assert_eq!(redact_url("host=db sslpassword='a b'"), "***");
        assert_eq!(redact_url("host=db user=gw"), "host=db user=gw");
        assert_eq!(redact_url("db.internal"), "db.internal");
    }
}
