//! `tools/list` in pages: a gateway's tools come from its upstreams, each bounded on its own
//! (`gateway::Upstream::max_tools`), and together they can be more than one answer should
//! carry. A page holds at most [`TOOLS_PAGE`] tools and, past its first tool, at most
//! [`TOOLS_PAGE_BYTES`] of their JSON; `nextCursor` names the last tool given, so the next page
//! goes on after it in the list as it stands then (a tool added or removed elsewhere moves
//! nothing). A cursor whose tool is no longer listed is refused (`-32602`): the client lists
//! again from the start, as the MCP specification's pagination lets a server require.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use serde_json::Value;

use crate::wire::error::RpcError;

/// The most tools one `tools/list` page holds.
pub(crate) const TOOLS_PAGE: usize = 256;

/// The most bytes of tool JSON one page holds past its first tool.
pub(crate) const TOOLS_PAGE_BYTES: usize = 1024 * 1024;

/// Prefix of a `tools/list` cursor's decoded text (a cursor of another list is refused).
const CURSOR_PREFIX: &str = "tools-after:";

/// The page of `tools` that `cursor` asks for, and the cursor of the next one.
pub(crate) fn tools_page(
    tools: Vec<Value>,
    cursor: Option<&str>,
) -> Result<(Vec<Value>, Option<String>), RpcError> {
    let start = match cursor {
        None => 0,
        Some(cursor) => {
            let after = decode(cursor).ok_or_else(|| {
                RpcError::invalid_params("invalid cursor: not one this server gave for tools/list")
            })?;
            let at = tools
                .iter()
                .position(|t| name_of(t) == Some(after.as_str()))
                .ok_or_else(|| {
                    // The name comes from the client's cursor: quoted at most in part.
                    let shown: String = after.chars().take(128).collect();
                    RpcError::invalid_params(format!(
                        "invalid cursor: the tool it goes on after, `{shown}`, is no longer listed; list again from the start"
                    ))
                })?;
            at + 1
        }
    };
    let total = tools.len();
    let mut page = Vec::new();
    let mut bytes = 0;
    for tool in tools.into_iter().skip(start) {
        let size = serde_json::to_vec(&tool).map_or(0, |v| v.len());
        if page.len() == TOOLS_PAGE || (!page.is_empty() && bytes + size > TOOLS_PAGE_BYTES) {
            break;
        }
        bytes += size;
        page.push(tool);
    }
    let next = (start + page.len() < total)
        .then(|| page.last().and_then(name_of).map(encode))
        .flatten();
    Ok((page, next))
}

fn name_of(tool: &Value) -> Option<&str> {
    tool.get("name").and_then(Value::as_str)
}

fn encode(name: &str) -> String {
    B64.encode(format!("{CURSOR_PREFIX}{name}"))
}

fn decode(cursor: &str) -> Option<String> {
    let text = String::from_utf8(B64.decode(cursor).ok()?).ok()?;
    text.strip_prefix(CURSOR_PREFIX).map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tools(n: usize) -> Vec<Value> {
        (0..n).map(|i| json!({ "name": format!("t{i}") })).collect()
    }

    fn names(page: &[Value]) -> Vec<&str> {
        page.iter().filter_map(name_of).collect()
    }

    /// Every page from the first, following `nextCursor`.
    fn all_pages(list: &[Value]) -> Vec<Vec<Value>> {
        let mut pages = Vec::new();
        let mut cursor = None;
        loop {
            let (page, next) = tools_page(list.to_vec(), cursor.as_deref()).unwrap();
            pages.push(page);
            match next {
                Some(n) => cursor = Some(n),
                None => return pages,
            }
        }
    }

    #[test]
    fn a_short_list_is_one_page_without_a_cursor() {
        let (page, next) = tools_page(tools(3), None).unwrap();
        assert_eq!(names(&page), ["t0", "t1", "t2"]);
        assert_eq!(next, None);
        assert_eq!(tools_page(Vec::new(), None).unwrap(), (Vec::new(), None));
        let (page, next) = tools_page(tools(TOOLS_PAGE), None).unwrap();
        assert_eq!((page.len(), next), (TOOLS_PAGE, None));
    }

    #[test]
    fn a_long_list_is_paged_by_count_and_every_tool_comes_once() {
        let list = tools(2 * TOOLS_PAGE + 7);
        let pages = all_pages(&list);
        assert_eq!(
            pages.iter().map(Vec::len).collect::<Vec<_>>(),
            [TOOLS_PAGE, TOOLS_PAGE, 7]
        );
        let seen: Vec<Value> = pages.into_iter().flatten().collect();
        assert_eq!(seen, list);
    }

    #[test]
    fn large_tools_are_paged_by_bytes_and_one_too_large_still_comes() {
        let big = "x".repeat(TOOLS_PAGE_BYTES / 3);
        let mut list: Vec<Value> = (0..7)
            .map(|i| json!({ "name": format!("b{i}"), "description": big }))
            .collect();
        list.insert(
            3,
            json!({ "name": "huge", "description": "y".repeat(2 * TOOLS_PAGE_BYTES) }),
        );
        let pages = all_pages(&list);
        for page in &pages {
            let bytes: usize = page
                .iter()
                .map(|t| serde_json::to_vec(t).unwrap().len())
                .sum();
            assert!(
                page.len() == 1 || bytes <= TOOLS_PAGE_BYTES,
                "{} tools, {bytes} bytes",
                page.len()
            );
        }
        assert!(
            pages.iter().any(|p| names(p) == ["huge"]),
            "alone on its page"
        );
        let seen: Vec<Value> = pages.into_iter().flatten().collect();
        assert_eq!(seen, list);
    }

    #[test]
    fn a_cursor_goes_on_after_its_tool_in_the_list_as_it_stands() {
        let list = tools(TOOLS_PAGE + 10);
        let (first, next) = tools_page(list.clone(), None).unwrap();
        let cursor = next.expect("a second page");
        // A tool before the cursor's goes away and another is added at the end: the next page
        // starts right after the last tool given, and has the new one.
        let mut changed = list;
        changed.remove(0);
        changed.push(json!({ "name": "new" }));
        let (second, next) = tools_page(changed, Some(&cursor)).unwrap();
        assert_eq!(first.last().and_then(name_of), Some("t255"));
        assert_eq!(names(&second)[0], "t256");
        assert_eq!(names(&second).last(), Some(&"new"));
        assert_eq!(next, None);
    }

    #[test]
    fn a_cursor_of_nothing_given_or_of_a_tool_gone_is_refused() {
        for bad in ["page-2", "", "%%%", &B64.encode("other-list:t1")] {
            let e = tools_page(tools(3), Some(bad)).unwrap_err();
            assert_eq!(e.code, crate::wire::error::code::INVALID_PARAMS, "{bad}");
            assert!(e.message.contains("invalid cursor"), "{}", e.message);
        }
        let e = tools_page(tools(3), Some(&encode("gone"))).unwrap_err();
        assert!(
            e.message.contains("`gone`") && e.message.contains("list again"),
            "{}",
            e.message
        );
        // A forged cursor naming a long tool is quoted in part only.
        let e = tools_page(tools(3), Some(&encode(&"n".repeat(10_000)))).unwrap_err();
        assert!(e.message.len() < 300, "{} bytes", e.message.len());
    }
}
