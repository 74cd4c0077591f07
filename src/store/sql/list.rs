//! A list of values bound as one parameter of a statement: a PostgreSQL array
//! or a JSON array for SQLite, matched with [`in_list`]. The statement is then
//! the same whatever the list's length, so each connection prepares it once.
use super::schema::Dialect;
use crate::secret::SecretHash;
use std::fmt::Write as _;

/// A list on PostgreSQL: the values come as one text array.
const BATCH_LOOKUP_PG: &str = "= ANY($1::text[])";
/// A list on SQLite: the values come as one JSON array.
const BATCH_LOOKUP_SQLITE: &str = "IN (SELECT value FROM json_each($1))";

/// The condition a batched statement puts after its column: "in the list bound as `$1`".
pub(super) fn in_list(dialect: Dialect) -> &'static str {
    match dialect {
        Dialect::Postgres => BATCH_LOOKUP_PG,
        Dialect::Sqlite => BATCH_LOOKUP_SQLITE,
    }
}

/// `items` as the one parameter of a batched statement (see [`in_list`]): a
/// PostgreSQL array literal or a JSON array, each item quoted and escaped.
pub(super) fn text_list<'a>(dialect: Dialect, items: impl Iterator<Item = &'a str>) -> String {
    let (open, close) = match dialect {
        Dialect::Postgres => ('{', '}'),
        Dialect::Sqlite => ('[', ']'),
    };
    let mut list = String::new();
    list.push(open);
    for (i, item) in items.enumerate() {
        if i > 0 {
            list.push(',');
        }
        list.push('"');
        for c in item.chars() {
            match (dialect, c) {
                (_, '"' | '\\') => {
                    list.push('\\');
                    list.push(c);
                }
                // JSON strings hold no raw control characters.
                (Dialect::Sqlite, c) if c.is_control() => {
                    let _ = write!(list, "\\u{:04x}", u32::from(c));
                }
                _ => list.push(c),
            }
        }
        list.push('"');
    }
    list.push(close);
    list
}

/// `hashes` as the one parameter of the batched lookup: `{h1,h2}` (a
/// PostgreSQL array literal) or `["h1","h2"]` (JSON). Hex needs no quoting.
pub(super) fn hash_list(dialect: Dialect, hashes: &[SecretHash]) -> String {
    let (open, quote, close) = match dialect {
        Dialect::Postgres => ('{', "", '}'),
        Dialect::Sqlite => ('[', "\"", ']'),
    };
    let mut list = String::with_capacity(2 + hashes.len() * 67);
    list.push(open);
    for (i, hash) in hashes.iter().enumerate() {
        if i > 0 {
            list.push(',');
        }
        let _ = write!(list, "{quote}{}{quote}", hash.to_hex());
    }
    list.push(close);
    list
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::secret::hash_secret;

    #[test]
    fn hash_lists_and_hex_round_trip() {
        let (a, b) = (hash_secret("a"), hash_secret("b"));
        let pg = hash_list(Dialect::Postgres, &[a, b]);
        assert_eq!(pg, format!("{{{},{}}}", a.to_hex(), b.to_hex()));
        let json = hash_list(Dialect::Sqlite, &[a]);
        assert_eq!(json, format!("[\"{}\"]", a.to_hex()));
    }

    #[test]
    fn text_lists_quote_and_escape_every_item() {
        let items = ["alice", "NULL", "a\"b\\c", "x\ny"];
        let pg = text_list(Dialect::Postgres, items.into_iter());
        assert_eq!(pg, "{\"alice\",\"NULL\",\"a\\\"b\\\\c\",\"x\ny\"}");
        let json = text_list(Dialect::Sqlite, items.into_iter());
        let parsed: Vec<String> = serde_json::from_str(&json).unwrap_or_default();
        assert_eq!(parsed, items);
        assert_eq!(text_list(Dialect::Postgres, std::iter::empty()), "{}");
    }
}
