//! The console's query strings: the list filters (`status`, `tool`, `owner`, `from`, `to`,
//! `q`), the cursor and the page size, read into a [`ListingFilter`] with a message naming
//! the parameter for anything malformed.

use std::collections::BTreeMap;

use percent_encoding::percent_decode_str;

use crate::store::listing::{ListedStatus, ListingCursor, ListingFilter};
use crate::store::owner_key;

/// The page size when the query names none.
pub(super) const DEFAULT_LIMIT: usize = 50;
/// The largest page a request may ask for.
pub(super) const MAX_LIMIT: usize = 200;

/// The parameters of a query string (`+` is a space; the last of a repeated name wins;
/// empty values are absent: an empty filter field of the form means "any").
pub(super) fn params(query: Option<&str>) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let decode = |s: &str| {
            percent_decode_str(&s.replace('+', " "))
                .decode_utf8_lossy()
                .into_owned()
        };
        let value = decode(v);
        if !value.trim().is_empty() {
            out.insert(decode(k), value);
        }
    }
    out
}

/// A list request: its filter, where it starts and how many it wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ListQuery {
    pub(super) filter: ListingFilter,
    pub(super) cursor: Option<ListingCursor>,
    pub(super) limit: usize,
}

/// Reads a list request from `params`.
pub(super) fn list_query(params: &BTreeMap<String, String>) -> Result<ListQuery, String> {
    let mut filter = ListingFilter::default();
    if let Some(s) = params.get("status") {
        filter.status = Some(ListedStatus::parse(s.trim()).ok_or_else(|| {
            format!(
                "status: `{s}` is not a status (working, input_required, completed, failed, cancelled)"
            )
        })?);
    }
    if let Some(t) = params.get("tool") {
        filter.tool = Some(t.trim().to_owned());
    }
    if let Some(o) = params.get("owner") {
        filter.owner = Some(owner_param(o));
    }
    if let Some(f) = params.get("from") {
        filter.created_from = Some(time_param("from", f)?);
    }
    if let Some(t) = params.get("to") {
        filter.created_to = Some(time_param("to", t)?);
    }
    if let Some(q) = params.get("q") {
        if q.len() > 200 {
            return Err("q: at most 200 bytes".into());
        }
        filter = filter.with_text(q);
    }
    let cursor =
        match params.get("cursor") {
            Some(c) => Some(ListingCursor::from_token(c.trim()).ok_or_else(|| {
                "cursor: malformed (use the `next` of the previous page)".to_owned()
            })?),
            None => None,
        };
    let limit = match params.get("limit") {
        Some(l) => match l.trim().parse::<usize>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => n,
            _ => return Err(format!("limit: a number from 1 to {MAX_LIMIT}")),
        },
        None => DEFAULT_LIMIT,
    };
    Ok(ListQuery {
        filter,
        cursor,
        limit,
    })
}

/// The owner key of an `owner` parameter: `tenant/principal`, or a bare principal of the
/// empty tenant.
pub(super) fn owner_param(value: &str) -> String {
    let value = value.trim();
    match value.split_once('/') {
        Some((tenant, principal)) => owner_key(tenant, principal),
        None => owner_key("", value),
    }
}

/// A time parameter in ms since the epoch: RFC 3339 (`2026-12-04T10:00:00Z`), a date and
/// time without an offset (UTC; what a `datetime-local` input sends), a date (midnight UTC),
/// or ms.
pub(super) fn time_param(name: &str, value: &str) -> Result<u64, String> {
    use time::format_description::well_known::Rfc3339;
    use time::macros::format_description;
    let value = value.trim();
    let bad = || {
        format!(
            "{name}: `{value}` is not a time (2026-12-04, 2026-12-04T10:00, RFC 3339, or ms since the epoch)"
        )
    };
    if let Ok(ms) = value.parse::<u64>() {
        return Ok(ms);
    }
    let at = if let Ok(t) = time::OffsetDateTime::parse(value, &Rfc3339) {
        t
    } else if let Ok(t) = time::PrimitiveDateTime::parse(
        value,
        format_description!("[year]-[month]-[day]T[hour]:[minute]"),
    ) {
        t.assume_utc()
    } else if let Ok(t) = time::PrimitiveDateTime::parse(
        value,
        format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]"),
    ) {
        t.assume_utc()
    } else if let Ok(d) = time::Date::parse(value, format_description!("[year]-[month]-[day]")) {
        d.midnight().assume_utc()
    } else {
        return Err(bad());
    };
    u64::try_from(at.unix_timestamp_nanos() / 1_000_000).map_err(|_| bad())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_are_read_from_the_query_string() {
        let p = params(Some(
            "status=input_required&tool=sleep&owner=acme%2Falice&from=2026-12-04&to=1000&q=disk+full&limit=10&x=",
        ));
        let q = list_query(&p).unwrap();
        assert_eq!(q.filter.status, Some(ListedStatus::InputRequired));
        assert_eq!(q.filter.tool.as_deref(), Some("sleep"));
        assert_eq!(q.filter.owner, Some(owner_key("acme", "alice")));
        assert_eq!(q.filter.created_from, Some(1_796_342_400_000));
        assert_eq!(q.filter.created_to, Some(1000));
        assert_eq!(q.filter.text.as_deref(), Some("disk full"));
        assert_eq!(q.limit, 10);
        // Empty fields of the form are absent.
        assert_eq!(
            list_query(&params(Some("status=&tool="))).unwrap().filter,
            ListingFilter::default()
        );
    }

    #[test]
    fn bad_values_name_their_parameter() {
        for (query, name) in [
            ("status=done", "status:"),
            ("from=yesterday", "from:"),
            ("limit=0", "limit:"),
            ("limit=5000", "limit:"),
            ("cursor=nope", "cursor:"),
        ] {
            let err = list_query(&params(Some(query))).unwrap_err();
            assert!(err.starts_with(name), "{query}: {err}");
        }
    }

    #[test]
    fn times_in_every_accepted_form() {
        assert_eq!(
            time_param("t", "2026-12-04T10:00").unwrap(),
            1_796_378_400_000
        );
        assert_eq!(
            time_param("t", "2026-12-04T10:00:00Z").unwrap(),
            1_796_378_400_000
        );
        assert_eq!(
            time_param("t", "2026-12-04T11:00:00+01:00").unwrap(),
            1_796_378_400_000
        );
        assert_eq!(owner_param("bob"), owner_key("", "bob"));
    }
}
