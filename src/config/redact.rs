//! Store and Redis URLs as they may be shown: in log lines, `migrate`'s
//! output and config errors, never with a password.

/// Replaces the password of `scheme://user:password@host` and the value of a
/// `password=` query parameter with `***`.
pub(crate) fn redact_url(url: &str) -> String {
    let Some(scheme_end) = url.find("://") else {
        return url.to_string();
    };
    let (head, rest) = url.split_at(scheme_end + 3);
    let mut out = String::with_capacity(url.len());
    out.push_str(head);
    // URL parsers take the *last* `@` as the end of the user info, so a
    // password holding a raw `@`, `/` or `?` still ends there (an `@` in the
    // query can only make this hide too much, never too little).
    let rest = match rest.rfind('@').map(|at| rest.split_at(at)) {
        Some((userinfo, host)) => {
            match userinfo.split_once(':') {
                Some((user, _)) => {
                    out.push_str(user);
                    out.push_str(":***");
                }
                None => out.push_str(userinfo),
            }
            host
        }
        None => rest,
    };
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
            Some((name, _)) if name.eq_ignore_ascii_case("password") => {
                out.push_str(name);
                out.push_str("=***");
            }
            _ => out.push_str(pair),
        }
    }
    out
}
