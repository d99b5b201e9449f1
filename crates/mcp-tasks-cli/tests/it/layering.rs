//! The workspace's layers, checked from the sources.
//!
//! - Crates: the store (`crates/mcp-tasks-store`) names no other crate of the workspace, in
//!   its code or its manifest (it knows nothing of tasks); the library (`crates/mcp-tasks`)
//!   names neither the command line nor the test kit; the test kit does not name the command
//!   line; the command line's own code uses the library's public API only (never
//!   `mcp_tasks::internals`).
//! - Modules: the library's modules form layers without cycles: a module never names,
//!   directly or through others, a module that names it back. Reads every `crate::` path in
//!   the library's `src/` (test code and comments excluded), builds the graph of top-level
//!   modules and fails on any strongly connected component bigger than one module, printing
//!   where each edge of it comes from.
//! - Layers: the crate documentation (`crates/mcp-tasks/src/lib.rs`) lists the library's
//!   layers bottom-up; every top-level module is in exactly one, and names only modules of
//!   lower layers (`modules_name_only_lower_layers`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `from → to → files where from names to`.
type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

/// A crate's folder in the workspace.
fn crate_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(name)
}

/// The `[dependencies]` table (normal dependencies only) of a crate's manifest, as text.
fn normal_dependencies(name: &str) -> String {
    let manifest = std::fs::read_to_string(crate_dir(name).join("Cargo.toml")).expect("a manifest");
    let start = manifest
        .find("\n[dependencies]\n")
        .expect("a [dependencies] table");
    let table = &manifest[start + 1..];
    let end = table[1..].find("\n[").map_or(table.len(), |i| i + 1);
    table[..end].to_owned()
}

/// Every file under a crate's `src/` that names `needle` outside comments: `(file, line)`.
fn mentions(name: &str, needle: &str) -> Vec<String> {
    let src = crate_dir(name).join("src");
    let mut found = Vec::new();
    for file in rust_files(&src) {
        let text = std::fs::read_to_string(&file).expect("read a source file");
        for (i, line) in without_comments(&text).lines().enumerate() {
            if line.contains(needle) {
                found.push(format!("{}:{}", file.display(), i + 1));
            }
        }
    }
    found
}

#[test]
fn crates_depend_downwards_only() {
    let store = normal_dependencies("mcp-tasks-store");
    assert!(
        !store.contains("mcp-tasks"),
        "the store depends on another crate of the workspace:\n{store}"
    );
    for needle in ["mcp_tasks::", "mcp_tasks_cli", "mcp_tasks_testkit"] {
        let found = mentions("mcp-tasks-store", needle);
        assert!(found.is_empty(), "the store names {needle}: {found:?}");
    }
    let library = normal_dependencies("mcp-tasks");
    assert!(
        !library.contains("mcp-tasks-cli") && !library.contains("mcp-tasks-testkit"),
        "the library depends on the command line or the test kit:\n{library}"
    );
    let testkit = normal_dependencies("mcp-tasks-testkit");
    assert!(
        testkit.contains("mcp-tasks") && !testkit.contains("mcp-tasks-cli"),
        "the test kit depends on the command line:\n{testkit}"
    );
    for needle in ["mcp_tasks_cli", "mcp_tasks_testkit"] {
        let found = mentions("mcp-tasks", needle);
        assert!(found.is_empty(), "the library names {needle}: {found:?}");
    }
    let found = mentions("mcp-tasks-testkit", "mcp_tasks_cli");
    assert!(
        found.is_empty(),
        "the test kit names the command line: {found:?}"
    );
    let found = mentions("mcp-tasks-cli", "mcp_tasks::internals");
    assert!(
        found.is_empty(),
        "the command line uses the library's internals, which have no stability promise: {found:?}"
    );
}

/// The checks above see what they look for: the library's manifest does name its own
/// dependencies, and the test kit's sources do name the library.
#[test]
fn the_crate_checks_see_names() {
    assert!(normal_dependencies("mcp-tasks").contains("ractor"));
    assert!(normal_dependencies("mcp-tasks").contains("mcp-tasks-store"));
    assert!(normal_dependencies("mcp-tasks-store").contains("redb"));
    assert!(!mentions("mcp-tasks-testkit", "mcp_tasks::").is_empty());
    assert!(!normal_dependencies("mcp-tasks-cli").contains("[dev-dependencies]"));
}

#[test]
fn no_module_level_import_cycle() {
    let src = crate_dir("mcp-tasks").join("src");
    let graph = graph_of(&src);
    assert!(
        graph.len() > 10,
        "the scan found too few modules: {:?}",
        graph.keys().collect::<Vec<_>>()
    );
    let cycles = cycles(&graph);
    if !cycles.is_empty() {
        let mut report = String::new();
        for members in &cycles {
            report.push_str(&format!("cycle among {members:?}:\n"));
            for from in members {
                for (to, files) in &graph[from] {
                    if members.contains(to) {
                        report.push_str(&format!("  {from} -> {to} (in {files:?})\n"));
                    }
                }
            }
        }
        panic!("module-level import cycles:\n{report}");
    }
}

/// The checker itself finds a cycle, also one through a third module, and reads grouped
/// `use crate::{…}` imports while ignoring comments and test modules.
#[test]
fn the_checker_sees_cycles() {
    let mut graph = Graph::new();
    let files = [
        ("a", "use crate::{b::X, c};\n// crate::d in a comment\n"),
        ("b", "fn f() { crate::c::g() }\n"),
        (
            "c",
            "use crate::a::Y;\n#[cfg(test)]\nmod tests { use crate::d::Z; }\n",
        ),
        ("d", "use crate::a::W;\n"),
    ];
    for (module, text) in files {
        add_edges(&mut graph, module, &format!("{module}.rs"), text);
    }
    assert!(!graph["c"].contains_key("d"), "test modules are skipped");
    assert!(!graph["a"].contains_key("d"), "comments are skipped");
    assert_eq!(
        cycles(&graph),
        vec![BTreeSet::from(["a".to_owned(), "b".into(), "c".into()])]
    );
}

fn graph_of(src: &Path) -> Graph {
    let modules: BTreeSet<String> = std::fs::read_dir(src)
        .expect("read src/")
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            Some(name.strip_suffix(".rs").unwrap_or(&name).to_owned())
        })
        .collect();
    let mut graph = Graph::new();
    for file in rust_files(src) {
        let rel = file.strip_prefix(src).expect("under src/");
        let rel_text = rel.to_string_lossy().replace('\\', "/");
        let top = rel_text.split('/').next().unwrap_or_default();
        let top = top.strip_suffix(".rs").unwrap_or(top).to_owned();
        let name = file.file_name().and_then(|n| n.to_str()).unwrap_or("");
        // The crate root, the binary (and its own modules), and test-only files.
        if top == "lib"
            || name == "tests.rs"
            || name.ends_with("_tests.rs")
            || rel_text.contains("/tests/")
        {
            continue;
        }
        let text = std::fs::read_to_string(&file).expect("read a source file");
        add_edges(&mut graph, &top, &rel_text, &text);
    }
    // Only edges between modules of this crate.
    for targets in graph.values_mut() {
        targets.retain(|to, _| modules.contains(to));
    }
    graph
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("read a source directory") {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out
}

fn add_edges(graph: &mut Graph, from: &str, file: &str, text: &str) {
    let code = without_test_items(&without_comments(text));
    let edges = graph.entry(from.to_owned()).or_default();
    for to in crate_paths(&code) {
        if to != from {
            edges.entry(to).or_default().insert(file.to_owned());
        }
    }
}

/// Drops `//` comments (doc comments included); string literals containing `//` lose the
/// rest of their line, which only ever removes text.
fn without_comments(text: &str) -> String {
    text.lines()
        .map(|line| line.find("//").map_or(line, |i| &line[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Drops every item annotated `#[cfg(test)]` (up to its `;` or its balanced `{…}`).
fn without_test_items(code: &str) -> String {
    let mut out = String::new();
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at + "#[cfg(test)]".len()..];
        let end = match (item.find('{'), item.find(';')) {
            (Some(open), semi) if semi.is_none_or(|s| open < s) => {
                let mut depth = 0usize;
                let mut end = item.len();
                for (i, c) in item[open..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = open + i + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (_, Some(semi)) => semi + 1,
            _ => item.len(),
        };
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// The first segment of every `crate::` path, including each member of a grouped
/// `use crate::{a::X, b}`.
fn crate_paths(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        let preceded_by_ident = rest[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_');
        rest = &rest[at + "crate::".len()..];
        if preceded_by_ident {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            // Members at depth 1 of the group.
            let mut depth = 1usize;
            let mut member = String::new();
            let mut at_member_start = true;
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => at_member_start = true,
                    c if at_member_start && (c.is_alphanumeric() || c == '_') => member.push(c),
                    _ if at_member_start && !member.is_empty() => {
                        out.insert(std::mem::take(&mut member));
                        at_member_start = false;
                    }
                    _ => {}
                }
            }
            if !member.is_empty() {
                out.insert(member);
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                out.insert(name);
            }
        }
    }
    out
}

/// Strongly connected components with more than one module (Tarjan).
fn cycles(graph: &Graph) -> Vec<BTreeSet<String>> {
    struct State<'a> {
        graph: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on_stack: BTreeSet<&'a str>,
        next: usize,
        out: Vec<BTreeSet<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        let graph = s.graph;
        for w in graph.get(v).into_iter().flat_map(|t| t.keys()) {
            let w = w.as_str();
            if !s.index.contains_key(w) {
                visit(s, w);
                let lw = s.low[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(lw);
            } else if s.on_stack.contains(w) {
                let iw = s.index[w];
                let lv = s.low.get_mut(v).expect("visited");
                *lv = (*lv).min(iw);
            }
        }
        if s.low[v] == s.index[v] {
            let mut component = BTreeSet::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.insert(w.to_owned());
                if w == v {
                    break;
                }
            }
            if component.len() > 1 {
                s.out.push(component);
            }
        }
    }
    let mut s = State {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in graph.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// The library's layers as its crate documentation lists them (`src/lib.rs`, the numbered
/// list after "Everything is layered bottom-up"): each item's modules, bottom first.
fn declared_layers() -> Vec<BTreeSet<String>> {
    let lib = std::fs::read_to_string(crate_dir("mcp-tasks").join("src/lib.rs")).expect("lib.rs");
    let mut layers: Vec<BTreeSet<String>> = Vec::new();
    let mut in_list = false;
    for line in lib.lines() {
        let Some(doc) = line.strip_prefix("//!") else {
            if in_list {
                break;
            }
            continue;
        };
        let doc = doc.trim_start();
        if doc.starts_with("types re-exported here. Everything is layered bottom-up") {
            in_list = true;
            continue;
        }
        if !in_list {
            continue;
        }
        if doc.starts_with('#') {
            break;
        }
        let numbered = doc
            .split_once(". ")
            .filter(|(n, _)| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
        let text = match numbered {
            Some((_, rest)) => {
                layers.push(BTreeSet::new());
                rest
            }
            None => doc,
        };
        let Some(layer) = layers.last_mut() else {
            continue;
        };
        // Every backticked lowercase name is a module of this layer; other backticked text
        // (a version, a path) is not a bare identifier.
        for (i, part) in text.split('`').enumerate() {
            if i % 2 == 1
                && !part.is_empty()
                && part.chars().all(|c| c.is_ascii_lowercase() || c == '_')
            {
                layer.insert(part.to_owned());
            }
        }
    }
    layers
}

/// The edges of `graph` that do not go to a strictly lower layer of `layers`, and the modules
/// no layer lists.
fn layer_violations(graph: &Graph, layers: &[BTreeSet<String>]) -> Vec<String> {
    let layer_of = |m: &str| layers.iter().position(|l| l.contains(m));
    let mut out = Vec::new();
    for (from, targets) in graph {
        let Some(high) = layer_of(from) else {
            out.push(format!("module `{from}` is in no layer"));
            continue;
        };
        for (to, files) in targets {
            match layer_of(to) {
                None => out.push(format!("module `{to}` is in no layer")),
                Some(low) if low >= high => out.push(format!(
                    "{from} (layer {}) names {to} (layer {}) in {files:?}",
                    high + 1,
                    low + 1
                )),
                Some(_) => {}
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Every module of the library is in one layer of the crate documentation's list, and names
/// only modules of lower layers: the order holds, not only the absence of cycles.
#[test]
fn modules_name_only_lower_layers() {
    let layers = declared_layers();
    assert!(
        layers.len() >= 10,
        "the layer list of src/lib.rs was not found or is too short: {layers:?}"
    );
    let mut seen = BTreeSet::new();
    for layer in &layers {
        for module in layer {
            assert!(seen.insert(module), "`{module}` is listed in two layers");
        }
    }
    let graph = graph_of(&crate_dir("mcp-tasks").join("src"));
    let violations = layer_violations(&graph, &layers);
    assert!(
        violations.is_empty(),
        "the library's modules break the layer order of src/lib.rs:\n{}",
        violations.join("\n")
    );
}

/// The order check sees an edge upwards, one within a layer and a module no layer lists.
#[test]
fn the_layer_check_sees_upward_edges() {
    let mut graph = Graph::new();
    add_edges(&mut graph, "a", "a.rs", "use crate::b::X;\n");
    add_edges(&mut graph, "b", "b.rs", "use crate::c::Y;\n");
    add_edges(&mut graph, "c", "c.rs", "use crate::d::Z;\n");
    let layers = [
        BTreeSet::from(["a".to_owned()]),
        BTreeSet::from(["b".to_owned(), "c".to_owned()]),
    ];
    assert_eq!(
        layer_violations(&graph, &layers),
        [
            "a (layer 1) names b (layer 2) in {\"a.rs\"}",
            "b (layer 2) names c (layer 2) in {\"b.rs\"}",
            "module `d` is in no layer",
        ]
    );
}
