//! Spec files as `apply` and `next --file` read them: JSON or YAML, one spec, an array, or
//! several YAML documents; a directory of such files; or `-` for stdin.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde_json::Value;

/// Every spec of `path`, each with where it came from (`file`, `file[2]`, `file#1`).
pub(crate) fn read_specs(path: &Path) -> anyhow::Result<Vec<(String, Value)>> {
    let mut out = Vec::new();
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("read stdin")?;
        push_specs(&mut out, "-", &text)?;
    } else if path.is_dir() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
            .with_context(|| format!("read directory {}", path.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "json" || x == "yaml" || x == "yml"))
            .collect();
        entries.sort();
        for entry in entries {
            out.extend(read_specs(&entry)?);
        }
    } else {
        let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        push_specs(&mut out, &path.display().to_string(), &text)?;
    }
    Ok(out)
}

/// A file holds one spec, an array of specs, or (YAML) several `---` documents of either.
fn push_specs(out: &mut Vec<(String, Value)>, source: &str, text: &str) -> anyhow::Result<()> {
    let documents: Vec<Value> = if text.trim_start().starts_with(['{', '[']) {
        vec![serde_json::from_str(text).with_context(|| format!("{source} is not valid JSON"))?]
    } else {
        use serde::Deserialize;
        serde_norway::Deserializer::from_str(text)
            .map(Value::deserialize)
            .collect::<Result<_, _>>()
            .with_context(|| format!("{source} is neither JSON nor valid YAML"))?
    };
    let many = documents.len() > 1;
    for (d, document) in documents.into_iter().enumerate() {
        let name = if many { format!("{source}#{d}") } else { source.to_string() };
        match document {
            Value::Array(items) => {
                out.extend(items.into_iter().enumerate().map(|(i, v)| (format!("{name}[{i}]"), v)))
            }
            Value::Null => {}
            other => out.push((name, other)),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_and_yaml_documents_are_named_by_position() {
        let mut out = Vec::new();
        push_specs(&mut out, "a.json", r#"[{"id": "x"}, {"id": "y"}]"#).unwrap();
        push_specs(&mut out, "b.yaml", "id: z\n---\n- id: w\n").unwrap();
        let names: Vec<&str> = out.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["a.json[0]", "a.json[1]", "b.yaml#0", "b.yaml#1[0]"]);
    }
}
