//! Renders the Envoy config templates in `envoy/`: each `${NAME}` or
//! `${NAME:-default}` becomes the value given for NAME, else the default.
//! Defaults may hold braces (JSON plugin configs); they nest.

use std::collections::HashMap;

/// Replaces every placeholder. Errors name the placeholder: one with no
/// value and no default, or one that is malformed.
pub fn render(template: &str, values: &HashMap<String, String>) -> Result<String, String> {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let name_len = after
            .find(|c: char| !(c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(after.len());
        let name = &after[..name_len];
        if name.is_empty() {
            return Err(format!(
                "placeholder without a name near {:?}",
                excerpt(after)
            ));
        }
        let tail = &after[name_len..];
        let (default, consumed) = if let Some(body) = tail.strip_prefix(":-") {
            let end =
                matching_brace(body).ok_or_else(|| format!("${{{name}:-…}} is not closed"))?;
            (Some(&body[..end]), 2 + end + 1)
        } else if tail.starts_with('}') {
            (None, 1)
        } else {
            return Err(format!("${{{name}…}}: expected '}}' or ':-'"));
        };
        match (values.get(name), default) {
            (Some(v), _) => out.push_str(v),
            (None, Some(d)) => out.push_str(d),
            (None, None) => return Err(format!("no value for ${{{name}}} and no default")),
        }
        rest = &tail[consumed..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Names of all placeholders in a template, in order of first use.
pub fn placeholders(template: &str) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    for piece in template.split("${").skip(1) {
        let name: String = piece
            .chars()
            .take_while(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || *c == '_')
            .collect();
        if !name.is_empty() && !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// Index of the `}` closing a default, counting nested braces.
fn matching_brace(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => return Some(i),
            '}' => depth -= 1,
            _ => {}
        }
    }
    None
}

fn excerpt(text: &str) -> &str {
    text.get(..20).unwrap_or(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vals(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn substitutes_values_and_defaults() {
        let t = "a: ${A:-1}\nb: ${B:-2}\nc: ${C}";
        assert_eq!(
            render(t, &vals(&[("B", "x"), ("C", "y")])).unwrap(),
            "a: 1\nb: x\nc: y"
        );
    }

    #[test]
    fn defaults_may_hold_json() {
        let t = r#"value: '${CFG:-{"a": {"b": 1}}}' end"#;
        assert_eq!(
            render(t, &vals(&[])).unwrap(),
            r#"value: '{"a": {"b": 1}}' end"#
        );
        assert_eq!(
            render(t, &vals(&[("CFG", "{}")])).unwrap(),
            "value: '{}' end"
        );
    }

    #[test]
    fn errors_name_the_placeholder() {
        assert!(render("${MISSING}", &vals(&[]))
            .unwrap_err()
            .contains("MISSING"));
        assert!(render("${OPEN:-{", &vals(&[]))
            .unwrap_err()
            .contains("OPEN"));
        assert!(render("${}", &vals(&[])).is_err());
        assert!(render("${X?}", &vals(&[])).unwrap_err().contains('X'));
    }

    #[test]
    fn lists_placeholders_once() {
        assert_eq!(placeholders("${A:-1} ${B} ${A}"), ["A", "B"]);
    }
}
