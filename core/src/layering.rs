//! The layering check: each library crate lists its modules in layers in its `lib.rs`
//! documentation, and its `tests/layering.rs` calls [`check`], which fails on any `crate::`
//! path in the code that points at a module of the same or a higher layer. The list in the
//! documentation is the rule itself, so the rule a reader sees is the rule the tests hold.
//!
//! The list is a `# Layers` heading followed by numbered lines, the top layer first, each naming
//! the modules of one layer in backticks:
//!
//! ```text
//! //! # Layers
//! //!
//! //! 1. `runtime`
//! //! 2. `reconcile`, `stream`
//! //! 3. `index`
//! ```
//!
//! Only code counts: comments (where intra-doc links may point anywhere) are skipped. Every
//! `pub mod`/`mod` of `lib.rs` must be in exactly one layer, so a new module has to be placed.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// Why a crate's layering does not hold, or could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LayeringError {
    /// A source file or directory could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// `lib.rs` has no `# Layers` list, or one that names a module twice or misses one.
    #[error("the layer list in {path} is not usable: {reason}")]
    List {
        /// The crate's `lib.rs`.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// Imports that point up or sideways, one line each.
    #[error("{} import(s) against the layers of {path}:\n{}", .found.len(), .found.join("\n"))]
    Violations {
        /// The crate's `lib.rs`.
        path: PathBuf,
        /// `file:line: module (layer n) imports other (layer m)`.
        found: Vec<String>,
    },
}

/// Checks the crate at `crate_dir` (its `src/lib.rs` and every `.rs` under `src/`).
pub fn check(crate_dir: &Path) -> Result<(), LayeringError> {
    let src = crate_dir.join("src");
    let lib = src.join("lib.rs");
    let lib_text = read(&lib)?;
    let layers = parse_layers(&lib_text).map_err(|reason| LayeringError::List {
        path: lib.clone(),
        reason,
    })?;
    let declared = declared_modules(&lib_text);
    let missing: Vec<_> = declared
        .iter()
        .filter(|m| !layers.contains_key(m.as_str()))
        .collect();
    if !missing.is_empty() {
        return Err(LayeringError::List {
            path: lib,
            reason: format!("modules in no layer: {missing:?}"),
        });
    }
    let mut found = Vec::new();
    for file in rust_files(&src)? {
        let relative = file.strip_prefix(&src).unwrap_or(&file).to_path_buf();
        let Some(module) = top_module(&relative) else {
            continue;
        };
        let Some(&own) = layers.get(module.as_str()) else {
            continue;
        };
        let text = read(&file)?;
        for (line_no, target) in crate_references(&text) {
            if target == module {
                continue;
            }
            if let Some(&theirs) = layers.get(target.as_str())
                && theirs <= own
            {
                found.push(format!(
                    "src/{}:{line_no}: `{module}` (layer {own}) imports `{target}` (layer {theirs})",
                    relative.display()
                ));
            }
        }
    }
    if found.is_empty() {
        Ok(())
    } else {
        Err(LayeringError::Violations { path: lib, found })
    }
}

fn read(path: &Path) -> Result<String, LayeringError> {
    fs::read_to_string(path).map_err(|source| LayeringError::Read {
        path: path.to_path_buf(),
        source,
    })
}

fn rust_files(dir: &Path) -> Result<Vec<PathBuf>, LayeringError> {
    let mut out = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = fs::read_dir(&dir).map_err(|source| LayeringError::Read {
            path: dir.clone(),
            source,
        })?;
        for entry in entries {
            let path = entry
                .map_err(|source| LayeringError::Read {
                    path: dir.clone(),
                    source,
                })?
                .path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The module a file belongs to: `index/sync.rs` and `index/mod.rs` → `index`, `ipam.rs` →
/// `ipam`; `lib.rs` and `main.rs` belong to none.
fn top_module(relative: &Path) -> Option<String> {
    let first = relative.components().next()?.as_os_str().to_str()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib" && name != "main").then(|| name.to_owned())
}

/// The layers, from the `# Layers` list: module → layer number (1 is the top).
fn parse_layers(lib: &str) -> Result<BTreeMap<String, usize>, String> {
    let mut layers = BTreeMap::new();
    let mut in_list = false;
    for line in lib.lines() {
        let Some(doc) = line.strip_prefix("//!") else {
            if in_list {
                break;
            }
            continue;
        };
        let doc = doc.trim();
        if doc.starts_with('#') {
            if in_list {
                break;
            }
            in_list = doc.trim_start_matches('#').trim() == "Layers";
            continue;
        }
        if !in_list {
            continue;
        }
        let Some((number, rest)) = doc.split_once(". ") else {
            continue;
        };
        let Ok(layer) = number.parse::<usize>() else {
            continue;
        };
        for module in rest.split('`').skip(1).step_by(2) {
            if layers.insert(module.to_owned(), layer).is_some() {
                return Err(format!("`{module}` is in two layers"));
            }
        }
    }
    if layers.is_empty() {
        return Err("no `# Layers` list of numbered lines naming modules in backticks".into());
    }
    Ok(layers)
}

/// The modules `lib.rs` declares (`pub mod x;`, `mod x;`).
fn declared_modules(lib: &str) -> Vec<String> {
    lib.lines()
        .filter_map(|line| {
            let line = line.trim();
            let rest = line
                .strip_prefix("pub mod ")
                .or_else(|| line.strip_prefix("mod "))?;
            rest.strip_suffix(';').map(str::to_owned)
        })
        .collect()
}

/// Every module named right after `crate::` in the code (comments skipped), with its line:
/// `crate::index::Index` → `index`; `crate::{ipam, index::sync}` → `ipam`, `index`.
fn crate_references(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let code = strip_comment(line);
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
                for name in group_heads(group) {
                    out.push((i + 1, name));
                }
            } else {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() {
                    out.push((i + 1, name));
                }
            }
        }
    }
    out
}

/// The first segment of each path in a `{…}` group (nested groups skipped), up to its close.
fn group_heads(group: &str) -> Vec<String> {
    let mut heads = Vec::new();
    let mut depth = 0usize;
    let mut at_start = true;
    let mut current = String::new();
    for c in group.chars() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                if !current.is_empty() {
                    heads.push(std::mem::take(&mut current));
                }
                at_start = true;
            }
            c if depth == 0 && at_start && (c.is_alphanumeric() || c == '_') => current.push(c),
            c if c.is_whitespace() => {}
            _ if depth == 0 && at_start && !current.is_empty() => {
                heads.push(std::mem::take(&mut current));
                at_start = false;
            }
            _ => {}
        }
    }
    if at_start && !current.is_empty() {
        heads.push(current);
    }
    heads.retain(|h| h != "self");
    heads
}

/// The line without a `//` comment; a `//` inside a string literal ends it too, which can only
/// hide a reference, never invent one.
fn strip_comment(line: &str) -> &str {
    line.find("//").map_or(line, |at| &line[..at])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_are_read_from_paths_and_groups_and_not_from_comments() {
        let text = "use crate::index::Index;\n\
                    use crate::{ipam, reports::Reports, kinds::{a, b}};\n\
                    // crate::runtime in a comment\n\
                    let x = crate::metrics::get(); // crate::stream\n\
                    use vmdhcp_crate::other;\n";
        let got: Vec<_> = crate_references(text);
        assert_eq!(
            got,
            [
                (1, "index".to_owned()),
                (2, "ipam".to_owned()),
                (2, "reports".to_owned()),
                (2, "kinds".to_owned()),
                (4, "metrics".to_owned()),
            ]
        );
    }

    #[test]
    fn the_layer_list_is_read_from_the_heading_on() {
        let lib = "//! The crate.\n//!\n//! # Layers\n//!\n//! 1. `runtime`\n\
                   //! 2. `reconcile`, `stream` (the gRPC layer)\n//! 3. `index`\n//!\n\
                   //! # Other\n//! 4. `not_a_layer`\npub mod index;\n";
        let layers = parse_layers(lib).unwrap();
        assert_eq!(layers.len(), 4);
        assert_eq!(layers["runtime"], 1);
        assert_eq!(layers["stream"], 2);
        assert_eq!(layers["index"], 3);
        assert!(!layers.contains_key("not_a_layer"));
        assert!(
            parse_layers("//! 1. `a`\n//! 2. `b`").is_err(),
            "no heading"
        );
        assert!(parse_layers("//! # Layers\n//! 1. `a`\n//! 2. `a`").is_err());
        assert_eq!(declared_modules(lib), ["index"]);
    }

    #[test]
    fn an_import_up_or_sideways_fails_and_names_the_file() -> Result<(), LayeringError> {
        let dir = std::env::temp_dir().join(format!("vmdhcp-layering-{}", std::process::id()));
        let src = dir.join("src");
        let write = |path: &str, text: &str| {
            let path = src.join(path);
            if let Some(parent) = path.parent() {
                fs::create_dir_all(parent).unwrap();
            }
            fs::write(path, text).unwrap();
        };
        write(
            "lib.rs",
            "//! # Layers\n//!\n//! 1. `top`\n//! 2. `mid`, `side`\n//! 3. `low`\n\
             pub mod top;\npub mod mid;\npub mod side;\npub mod low;\n",
        );
        write("top.rs", "use crate::mid::X;\nuse crate::low::Y;\n");
        write("mid/mod.rs", "use crate::low::Y;\n");
        write("side.rs", "use crate::low;\n");
        write("low.rs", "// [`crate::top`] is only a link\n");
        check(&dir)?;
        write("low.rs", "use crate::top::Z;\n");
        write("mid/inner.rs", "\n\nfn f() { crate::side::g() }\n");
        let err = check(&dir).unwrap_err();
        let LayeringError::Violations { found, .. } = &err else {
            panic!("{err}");
        };
        assert_eq!(
            found,
            &[
                "src/low.rs:1: `low` (layer 3) imports `top` (layer 1)",
                "src/mid/inner.rs:3: `mid` (layer 2) imports `side` (layer 2)",
            ]
        );
        write("low.rs", "");
        write("mid/inner.rs", "");
        write("extra.rs", "");
        fs::write(
            src.join("lib.rs"),
            "//! # Layers\n//! 1. `top`\npub mod top;\npub mod extra;\n",
        )
        .unwrap();
        assert!(matches!(check(&dir), Err(LayeringError::List { .. })));
        fs::remove_dir_all(&dir).unwrap();
        Ok(())
    }
}
