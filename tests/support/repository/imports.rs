//! The file-level import graph of the crate's sources: which file of src/ names an item that
//! another file defines, and the cycles among them.
//!
//! The library (src/lib.rs) and the command (src/main.rs) are read from their roots through
//! their `mod NAME;` declarations. Every path a file names — in `use` declarations and in code,
//! starting with `crate::`, `super::`, `self::`, a child module, a name a `use` bound to a
//! module, or (from the command) `prepare::` — is followed to the file that defines its item,
//! through re-exports. A `mod` declaration is not an edge, and neither is a re-export the file
//! does not use itself: a module that only gathers its children's items under one name depends
//! on none of them. Comments and string literals are skipped, so documentation links are not
//! edges either.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// Files, by path relative to src/, and the files each one names.
pub type Graph = BTreeMap<String, BTreeSet<String>>;

/// The import graph of `src` (the crate's src/ folder).
pub fn graph(src: &Path) -> Graph {
    let library = Tree::read(src, "lib.rs");
    let command = Tree::read(src, "main.rs");
    let mut graph = Graph::new();
    for tree in [&library, &command] {
        for (file, source) in &tree.files {
            let from = tree.relative(file);
            let edges = graph.entry(from.clone()).or_default();
            for (crate_name, path) in &source.named {
                let target = if crate_name.is_some() { &library } else { tree };
                let to = target.relative(&target.resolve(path, 0).0);
                if to != from {
                    edges.insert(to);
                }
            }
        }
    }
    graph
}

/// The graph as `file -> file, file` lines, one per file that names another.
pub fn render(graph: &Graph) -> String {
    let mut text = String::new();
    for (from, edges) in graph.iter().filter(|(_, edges)| !edges.is_empty()) {
        let to: Vec<&str> = edges.iter().map(String::as_str).collect();
        let _ = writeln!(text, "{from} -> {}", to.join(", "));
    }
    text
}

/// The graph between the top-level modules of src/ (`ladder` for every file under ladder/ and
/// for ladder.rs), without the edges inside one.
pub fn modules(graph: &Graph) -> Graph {
    let module = |file: &str| {
        let first = file.split('/').next().unwrap_or(file);
        first.strip_suffix(".rs").unwrap_or(first).to_owned()
    };
    let mut modules = Graph::new();
    for (from, edges) in graph {
        let from = module(from);
        let targets: BTreeSet<String> = edges
            .iter()
            .map(|to| module(to))
            .filter(|to| *to != from)
            .collect();
        modules.entry(from).or_default().extend(targets);
    }
    modules
}

/// The edges between the files of one cycle, as `file -> file` lines.
pub fn cycle_edges(graph: &Graph, cycle: &[String]) -> String {
    let mut text = String::new();
    for from in cycle {
        for to in graph[from].iter().filter(|to| cycle.contains(to)) {
            let _ = writeln!(text, "  {from} -> {to}");
        }
    }
    text
}

/// The graph's strongly connected components of more than one file, each sorted, as cycles.
pub fn cycles(graph: &Graph) -> Vec<Vec<String>> {
    // Tarjan's algorithm over the sorted nodes, so the answer is deterministic.
    struct State<'g> {
        graph: &'g Graph,
        index: HashMap<&'g str, usize>,
        low: HashMap<&'g str, usize>,
        stack: Vec<&'g str>,
        on_stack: BTreeSet<&'g str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'g>(state: &mut State<'g>, node: &'g str) {
        let next = state.index.len();
        state.index.insert(node, next);
        state.low.insert(node, next);
        state.stack.push(node);
        state.on_stack.insert(node);
        let targets: Vec<&'g str> = state
            .graph
            .get(node)
            .map(|edges| edges.iter().map(String::as_str).collect())
            .unwrap_or_default();
        for target in targets {
            if !state.index.contains_key(target) {
                visit(state, target);
                let low = state.low[node].min(state.low[target]);
                state.low.insert(node, low);
            } else if state.on_stack.contains(target) {
                let low = state.low[node].min(state.index[target]);
                state.low.insert(node, low);
            }
        }
        if state.low[node] == state.index[node] {
            let mut component = Vec::new();
            loop {
                let member = state.stack.pop().expect("the node is on the stack");
                state.on_stack.remove(member);
                component.push(member.to_owned());
                if member == node {
                    break;
                }
            }
            if component.len() > 1 {
                component.sort();
                state.found.push(component);
            }
        }
    }
    let mut state = State {
        graph,
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        found: Vec::new(),
    };
    for node in graph.keys() {
        if !state.index.contains_key(node.as_str()) {
            visit(&mut state, node);
        }
    }
    state.found.sort();
    state.found
}

/// One crate: its files by module path, and each file's parsed source.
struct Tree {
    src: PathBuf,
    /// Module path (without `crate`) to the file that holds the module.
    modules: BTreeMap<Vec<String>, PathBuf>,
    files: BTreeMap<PathBuf, Source>,
}

impl Tree {
    fn read(src: &Path, root: &str) -> Tree {
        let mut tree = Tree {
            src: src.to_owned(),
            modules: BTreeMap::new(),
            files: BTreeMap::new(),
        };
        tree.add(&[], src.join(root));
        tree
    }

    fn add(&mut self, module: &[String], file: PathBuf) {
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|error| panic!("cannot read {}: {error}", file.display()));
        let source = Source::parse(&text, module);
        // A root or mod.rs holds its children beside it; `a.rs` holds them in `a/`.
        let stem = file
            .file_stem()
            .and_then(|stem| stem.to_str())
            .unwrap_or("");
        let folder = if module.is_empty() || stem == "mod" {
            file.parent()
                .expect("a source file has a folder")
                .to_owned()
        } else {
            file.with_extension("")
        };
        let children = source.child_files.clone();
        self.modules.insert(module.to_vec(), file.clone());
        self.files.insert(file, source);
        for child in children {
            let flat = folder.join(format!("{child}.rs"));
            let nested = folder.join(&child).join("mod.rs");
            let path = if flat.exists() { flat } else { nested };
            let mut child_module = module.to_vec();
            child_module.push(child);
            self.add(&child_module, path);
        }
    }

    fn relative(&self, file: &Path) -> String {
        file.strip_prefix(&self.src)
            .unwrap_or(file)
            .to_string_lossy()
            .replace('\\', "/")
    }

    /// The file that defines the item `path` (from the crate root) names, and whether the item
    /// was found there (false: the path ends in the module's file without a known definition).
    fn resolve(&self, path: &[String], depth: usize) -> (PathBuf, bool) {
        let mut module: Vec<String> = Vec::new();
        let mut rest = path;
        while let Some((first, tail)) = rest.split_first() {
            let mut deeper = module.clone();
            deeper.push(first.clone());
            if !self.modules.contains_key(&deeper) {
                break;
            }
            module = deeper;
            rest = tail;
        }
        let file = self.modules[&module].clone();
        let Some((name, tail)) = rest.split_first() else {
            return (file, true);
        };
        let source = &self.files[&file];
        if source.definitions.contains(name) || depth > 16 {
            return (file, true);
        }
        if let Some(binding) = source.bindings.get(name) {
            if let Some(target) = binding {
                let mut full = target.clone();
                full.extend(tail.iter().cloned());
                return self.resolve(&full, depth + 1);
            }
            return (file, true);
        }
        for glob in &source.globs {
            let mut full = glob.clone();
            full.extend(rest.iter().cloned());
            let (target, found) = self.resolve(&full, depth + 1);
            if found {
                return (target, true);
            }
        }
        (file, false)
    }
}

/// What one file declares and names.
#[derive(Debug, Default)]
struct Source {
    /// Child modules kept in their own files (`mod NAME;`).
    child_files: Vec<String>,
    /// Names of items the file defines.
    definitions: BTreeSet<String>,
    /// Names `use` declarations at the file's top bind, with the absolute paths they name in
    /// this crate (`None`: a path in another crate).
    bindings: BTreeMap<String, Option<Vec<String>>>,
    /// Modules the file glob-imports at its top.
    globs: Vec<Vec<String>>,
    /// Paths the file names outside its re-exports, absolute, with the crate they are in
    /// (`None`: this crate; `Some("prepare")`: the library, named from the command).
    named: Vec<(Option<String>, Vec<String>)>,
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Ident(String),
    Punct(String),
}

impl Token {
    fn is(&self, text: &str) -> bool {
        match self {
            Token::Ident(word) | Token::Punct(word) => word == text,
        }
    }

    fn ident(&self) -> Option<&str> {
        match self {
            Token::Ident(word) => Some(word),
            Token::Punct(_) => None,
        }
    }
}

/// Rust tokens of `text`: identifiers and punctuation (`::` as one), without comments,
/// literals or lifetimes.
fn tokens(text: &str) -> Vec<Token> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = Vec::new();
    let mut at = 0;
    let peek = |at: usize| chars.get(at).copied().unwrap_or('\0');
    while at < chars.len() {
        let c = chars[at];
        if c.is_whitespace() {
            at += 1;
        } else if c == '/' && peek(at + 1) == '/' {
            while at < chars.len() && chars[at] != '\n' {
                at += 1;
            }
        } else if c == '/' && peek(at + 1) == '*' {
            let mut depth = 0;
            loop {
                if at >= chars.len() {
                    break;
                }
                if chars[at] == '/' && peek(at + 1) == '*' {
                    depth += 1;
                    at += 2;
                } else if chars[at] == '*' && peek(at + 1) == '/' {
                    depth -= 1;
                    at += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    at += 1;
                }
            }
        } else if c == '"' {
            at = skip_string(&chars, at + 1);
        } else if c == '\'' {
            if peek(at + 1) == '\\' {
                at += 2;
                while at < chars.len() && chars[at] != '\'' {
                    at += 1;
                }
                at += 1;
            } else if peek(at + 2) == '\'' {
                at += 3;
            } else {
                // A lifetime or label: skip it whole, so `'static T` does not read as a static.
                at += 1;
                while at < chars.len() && (chars[at].is_alphanumeric() || chars[at] == '_') {
                    at += 1;
                }
            }
        } else if c.is_alphabetic() || c == '_' {
            let start = at;
            while at < chars.len() && (chars[at].is_alphanumeric() || chars[at] == '_') {
                at += 1;
            }
            let word: String = chars[start..at].iter().collect();
            if (word == "r" || word == "br") && (peek(at) == '#' || peek(at) == '"') {
                let mut hashes = 0;
                while peek(at) == '#' {
                    hashes += 1;
                    at += 1;
                }
                if peek(at) == '"' {
                    at += 1;
                    loop {
                        if at >= chars.len() {
                            break;
                        }
                        if chars[at] == '"'
                            && (0..hashes).all(|offset| peek(at + 1 + offset) == '#')
                        {
                            at += 1 + hashes;
                            break;
                        }
                        at += 1;
                    }
                } else {
                    // A raw identifier, `r#name`.
                    out.push(Token::Ident(word));
                }
            } else if word == "b" && peek(at) == '"' {
                at = skip_string(&chars, at + 1);
            } else if word == "b" && peek(at) == '\'' {
                at += 1;
                while at < chars.len() && chars[at] != '\'' {
                    if chars[at] == '\\' {
                        at += 1;
                    }
                    at += 1;
                }
                at += 1;
            } else {
                out.push(Token::Ident(word));
            }
        } else if c.is_ascii_digit() {
            while at < chars.len() && (chars[at].is_alphanumeric() || chars[at] == '_') {
                at += 1;
            }
        } else if c == ':' && peek(at + 1) == ':' {
            out.push(Token::Punct("::".to_owned()));
            at += 2;
        } else {
            out.push(Token::Punct(c.to_string()));
            at += 1;
        }
    }
    out
}

/// The index just past the string literal whose body starts at `at`.
fn skip_string(chars: &[char], mut at: usize) -> usize {
    while at < chars.len() && chars[at] != '"' {
        if chars[at] == '\\' {
            at += 1;
        }
        at += 1;
    }
    at + 1
}

/// One leaf of a `use` tree: its path as written, and the name it binds (`None`: a glob).
struct UseLeaf {
    path: Vec<String>,
    binding: Option<String>,
}

/// Parses the `use` tree at `tokens[at..]` under `prefix`; returns the index after it.
fn use_tree(
    tokens: &[Token],
    mut at: usize,
    prefix: &[String],
    leaves: &mut Vec<UseLeaf>,
) -> usize {
    let mut path = prefix.to_vec();
    if tokens.get(at).is_some_and(|token| token.is("::")) {
        at += 1;
    }
    loop {
        match tokens.get(at) {
            Some(Token::Punct(p)) if p == "*" => {
                leaves.push(UseLeaf {
                    path,
                    binding: None,
                });
                return at + 1;
            }
            Some(Token::Punct(p)) if p == "{" => {
                at += 1;
                while !tokens.get(at).is_none_or(|token| token.is("}")) {
                    at = use_tree(tokens, at, &path, leaves);
                    if tokens.get(at).is_some_and(|token| token.is(",")) {
                        at += 1;
                    }
                }
                return at + 1;
            }
            Some(Token::Ident(word)) => {
                if word == "self" && !path.is_empty() {
                    // `a::{self}` binds `a`.
                } else {
                    path.push(word.clone());
                }
                at += 1;
                if tokens.get(at).is_some_and(|token| token.is("::")) {
                    at += 1;
                    continue;
                }
                let mut binding = path.last().cloned();
                if tokens.get(at).is_some_and(|token| token.is("as")) {
                    binding = tokens.get(at + 1).and_then(Token::ident).map(str::to_owned);
                    at += 2;
                }
                leaves.push(UseLeaf { path, binding });
                return at;
            }
            // Anything else ends the tree; skipping it keeps a malformed list from looping.
            _ => return at + 1,
        }
    }
}

/// Keywords followed by the name of the item they define.
const DEFINING: &[&str] = &[
    "struct", "enum", "fn", "const", "static", "type", "trait", "union", "mod",
];

impl Source {
    fn parse(text: &str, module: &[String]) -> Source {
        let tokens = tokens(text);
        let mut source = Source::default();
        // Inline modules (`mod tests { ... }`) open at these brace depths, with their names.
        let mut inline: Vec<(usize, String)> = Vec::new();
        let mut depth = 0;
        let mut at = 0;
        // Module-path prefixes: the file's module plus the inline modules around `at`.
        let scope = |inline: &[(usize, String)]| {
            let mut path = module.to_vec();
            path.extend(inline.iter().map(|(_, name)| name.clone()));
            path
        };
        let mut child_modules = BTreeSet::new();
        // First pass: definitions and child modules, so code paths can name them.
        for (index, token) in tokens.iter().enumerate() {
            if let Some(word) = token.ident() {
                if DEFINING.contains(&word) {
                    if let Some(name) = tokens.get(index + 1).and_then(Token::ident) {
                        if name != "fn" && name != "_" {
                            source.definitions.insert(name.to_owned());
                        }
                    }
                }
                if word == "mod" {
                    if let (Some(name), Some(next)) = (
                        tokens.get(index + 1).and_then(Token::ident),
                        tokens.get(index + 2),
                    ) {
                        if next.is(";") {
                            source.child_files.push(name.to_owned());
                            child_modules.insert(name.to_owned());
                        }
                    }
                }
                if word == "macro_rules" {
                    if let Some(name) = tokens.get(index + 2).and_then(Token::ident) {
                        source.definitions.insert(name.to_owned());
                    }
                }
            }
        }
        // Names bound to modules of this crate by `use`, in the file at any depth.
        let mut module_aliases: HashMap<String, (Option<String>, Vec<String>)> = HashMap::new();
        let mut reexports: Vec<(String, Option<String>, Vec<String>)> = Vec::new();
        let mut used_names: BTreeSet<String> = BTreeSet::new();
        while at < tokens.len() {
            let token = &tokens[at];
            if token.is("{") {
                let opens_inline = at >= 2 && tokens[at - 2].is("mod");
                depth += 1;
                if opens_inline {
                    if let Some(name) = tokens[at - 1].ident() {
                        inline.push((depth, name.to_owned()));
                    }
                }
                at += 1;
                continue;
            }
            if token.is("}") {
                if inline.last().is_some_and(|(open, _)| *open == depth) {
                    inline.pop();
                }
                depth -= 1;
                at += 1;
                continue;
            }
            if token.is("use") && !tokens.get(at + 1).is_some_and(|next| next.is("<")) {
                let public = at >= 1
                    && (tokens[at - 1].is("pub")
                        || (tokens[at - 1].is(")")
                            && tokens[..at]
                                .iter()
                                .rev()
                                .take(6)
                                .any(|token| token.is("pub"))));
                let mut leaves = Vec::new();
                let end = use_tree(&tokens, at + 1, &[], &mut leaves);
                let here = scope(&inline);
                for leaf in leaves {
                    let Some((crate_name, absolute)) =
                        absolute(&leaf.path, &here, module, &child_modules)
                    else {
                        if let Some(name) = leaf.binding {
                            if inline.is_empty() {
                                source.bindings.insert(name, None);
                            }
                        }
                        continue;
                    };
                    match leaf.binding {
                        None => {
                            if inline.is_empty() && crate_name.is_none() {
                                source.globs.push(absolute.clone());
                            }
                            source.named.push((crate_name, absolute));
                        }
                        Some(name) => {
                            module_aliases
                                .insert(name.clone(), (crate_name.clone(), absolute.clone()));
                            if public {
                                reexports.push((
                                    name.clone(),
                                    crate_name.clone(),
                                    absolute.clone(),
                                ));
                            } else {
                                source.named.push((crate_name.clone(), absolute.clone()));
                            }
                            if inline.is_empty() {
                                source
                                    .bindings
                                    .insert(name, crate_name.is_none().then_some(absolute));
                            }
                        }
                    }
                }
                at = end;
                continue;
            }
            // `pub(in crate::a)` names where an item is visible, not what it uses.
            if token.is("pub")
                && tokens.get(at + 1).is_some_and(|next| next.is("("))
                && tokens.get(at + 2).is_some_and(|next| next.is("in"))
            {
                while !tokens.get(at).is_none_or(|token| token.is(")")) {
                    at += 1;
                }
                continue;
            }
            if let Some(word) = token.ident() {
                used_names.insert(word.to_owned());
                let starts_path = at == 0 || !tokens[at - 1].is("::");
                if starts_path && tokens.get(at + 1).is_some_and(|next| next.is("::")) {
                    let mut path = vec![word.to_owned()];
                    let mut next = at + 2;
                    while let Some(segment) = tokens.get(next).and_then(Token::ident) {
                        path.push(segment.to_owned());
                        if tokens.get(next + 1).is_some_and(|token| token.is("::")) {
                            next += 2;
                        } else {
                            break;
                        }
                    }
                    let here = scope(&inline);
                    if let Some((crate_name, alias)) = module_aliases.get(word) {
                        let mut full = alias.clone();
                        full.extend(path[1..].iter().cloned());
                        source.named.push((crate_name.clone(), full));
                    } else if let Some(found) = absolute(&path, &here, module, &child_modules) {
                        source.named.push(found);
                    }
                    for segment in &path {
                        used_names.insert(segment.clone());
                    }
                    at = next + 1;
                    continue;
                }
            }
            at += 1;
        }
        // A re-export is an edge only where the file uses the name itself.
        for (name, crate_name, path) in reexports {
            if used_names.contains(&name) {
                source.named.push((crate_name, path));
            }
        }
        source
    }
}

/// The absolute form of `path`, named in module `here`: `(None, path)` in this crate,
/// `(Some("prepare"), path)` in the library named from the command; `None` for other crates.
/// `here` is the module the path is named in (inline modules included), `module` the file's: a
/// path may also start with one of the file's child modules.
fn absolute(
    path: &[String],
    here: &[String],
    module: &[String],
    child_modules: &BTreeSet<String>,
) -> Option<(Option<String>, Vec<String>)> {
    let (first, rest) = path.split_first()?;
    match first.as_str() {
        "crate" => Some((None, rest.to_vec())),
        "prepare" => Some((Some("prepare".to_owned()), rest.to_vec())),
        "self" => {
            let mut full = here.to_vec();
            full.extend(rest.iter().cloned());
            Some((None, full))
        }
        "super" => {
            let mut base = here.to_vec();
            base.pop();
            let mut rest = rest;
            while rest.first().is_some_and(|segment| segment == "super") {
                base.pop();
                rest = &rest[1..];
            }
            base.extend(rest.iter().cloned());
            Some((None, base))
        }
        name if child_modules.contains(name) => {
            let mut full = module.to_vec();
            full.extend(path.iter().cloned());
            Some((None, full))
        }
        _ => None,
    }
}
