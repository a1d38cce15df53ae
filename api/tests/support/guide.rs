//! The YAML examples of docs/user-guide.md, shared by the structural check
//! (api/tests/user_guide_examples.rs) and the API server's
//! (e2e/tests/user_guide.rs, which includes this file by path).

use serde::Deserialize;
use serde_json::Value;

pub const GUIDE: &str = "docs/user-guide.md";

/// The documents of every ```yaml block of `markdown`, with the line their
/// block starts on.
pub fn yaml_documents(markdown: &str) -> Vec<(usize, Value)> {
    let mut documents = Vec::new();
    let mut block: Option<(usize, usize, Vec<&str>)> = None;
    for (index, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match &mut block {
            None if trimmed == "```yaml" => block = Some((index + 2, indent, Vec::new())),
            None => {}
            Some((start, _, lines)) if trimmed == "```" => {
                let text = lines.join("\n");
                for document in serde_yaml_ng::Deserializer::from_str(&text) {
                    let value = Value::deserialize(document)
                        .unwrap_or_else(|e| panic!("{GUIDE}:{start}: invalid YAML: {e}"));
                    documents.push((*start, value));
                }
                block = None;
            }
            Some((_, indent, lines)) => lines.push(line.get(*indent..).unwrap_or("")),
        }
    }
    assert!(block.is_none(), "{GUIDE}: a ```yaml block is not closed");
    documents
}
