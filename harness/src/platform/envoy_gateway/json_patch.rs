//! JSON patch (RFC 6902), the operations the Envoy Gateway examples use
//! (`add`, `replace`, `remove`, `move`, `copy`, `test`), with Envoy Gateway's semantics
//! (internal/xds/translator/jsonpatch.go, internal/utils/jsonpatch:
//! evanphx/json-patch v5 with EnsurePathExistsOnAdd): an `add` creates the
//! missing parents of its path, nothing else does (a `copy` or a `move`
//! needs its destination's parent: v5.9.11 `v5/patch.go`, `copy` and
//! `move`). Paths are JSON pointers (RFC 6901). Not modelled: `jsonPath`
//! selectors, and the nulls v5 pads a missing array with before an index
//! past its start.

use serde_json::{json, Value};

/// RFC 6901: "" is the whole document, else "/"-separated, ~1 is "/", ~0 "~".
fn pointer(p: &str) -> Result<Vec<String>, String> {
    if p.is_empty() {
        return Ok(Vec::new());
    }
    let rest = p
        .strip_prefix('/')
        .ok_or_else(|| format!("pointer {p:?} does not start with '/'"))?;
    Ok(rest
        .split('/')
        .map(|t| t.replace("~1", "/").replace("~0", "~"))
        .collect())
}

fn array_index(token: &str, len: usize, may_append: bool) -> Result<usize, String> {
    if may_append && token == "-" {
        return Ok(len);
    }
    let i: usize = token
        .parse()
        .map_err(|_| format!("{token:?} is not an array index"))?;
    let bound = if may_append {
        len
    } else {
        len.saturating_sub(1)
    };
    if i > bound || (!may_append && len == 0) {
        return Err(format!("index {i} out of range (length {len})"));
    }
    Ok(i)
}

fn get_mut<'a>(doc: &'a mut Value, tokens: &[String]) -> Result<&'a mut Value, String> {
    let mut cur = doc;
    for t in tokens {
        cur = match cur {
            Value::Object(map) => map.get_mut(t).ok_or_else(|| format!("no member {t:?}"))?,
            Value::Array(items) => {
                let i = array_index(t, items.len(), false)?;
                &mut items[i]
            }
            _ => return Err(format!("{t:?}: not inside an object or array")),
        };
    }
    Ok(cur)
}

/// `add`; missing parents are created (objects, or arrays when the next
/// token is an index), as Envoy Gateway's EnsurePathExistsOnAdd does.
fn add(doc: &mut Value, tokens: &[String], value: Value, ensure: bool) -> Result<(), String> {
    let Some((last, parents)) = tokens.split_last() else {
        *doc = value;
        return Ok(());
    };
    let mut cur = doc;
    for (i, t) in parents.iter().enumerate() {
        let next = &tokens[i + 1];
        let next_is_index = next == "-" || next.parse::<usize>().is_ok();
        cur = match cur {
            Value::Object(map) => {
                if !map.contains_key(t) {
                    if !ensure {
                        return Err(format!("no member {t:?}"));
                    }
                    let fresh = if next_is_index { json!([]) } else { json!({}) };
                    map.insert(t.clone(), fresh);
                }
                map.get_mut(t).ok_or_else(|| format!("no member {t:?}"))?
            }
            Value::Array(items) => {
                let i = array_index(t, items.len(), false)?;
                &mut items[i]
            }
            _ => return Err(format!("{t:?}: not inside an object or array")),
        };
    }
    match cur {
        Value::Object(map) => {
            map.insert(last.clone(), value);
            Ok(())
        }
        Value::Array(items) => {
            let i = array_index(last, items.len(), true)?;
            items.insert(i, value);
            Ok(())
        }
        _ => Err(format!("{last:?}: not inside an object or array")),
    }
}

/// The value at `tokens`, borrowed.
fn get<'a>(doc: &'a Value, tokens: &[String]) -> Result<&'a Value, String> {
    let mut cur = doc;
    for t in tokens {
        cur = match cur {
            Value::Object(map) => map.get(t).ok_or_else(|| format!("no member {t:?}"))?,
            Value::Array(items) => {
                let i = array_index(t, items.len(), false)?;
                &items[i]
            }
            _ => return Err(format!("{t:?}: not inside an object or array")),
        };
    }
    Ok(cur)
}

/// `test`: the value at the path equals the operation's (a missing member
/// equals only `null`, as in v5).
fn test(doc: &Value, tokens: &[String], want: &Value) -> Result<(), String> {
    let found = match tokens.split_last() {
        None => Some(doc),
        Some((last, parents)) => match get(doc, parents)? {
            Value::Object(map) => map.get(last),
            Value::Array(items) => Some(&items[array_index(last, items.len(), false)?]),
            _ => return Err(format!("{last:?}: not inside an object or array")),
        },
    };
    match found {
        Some(v) if v == want => Ok(()),
        None if want.is_null() => Ok(()),
        Some(v) => Err(format!("testing value failed: found {v}, want {want}")),
        None => Err(format!("testing value failed: nothing there, want {want}")),
    }
}

fn remove(doc: &mut Value, tokens: &[String]) -> Result<Value, String> {
    let (last, parents) = tokens
        .split_last()
        .ok_or("cannot remove the whole document")?;
    match get_mut(doc, parents)? {
        Value::Object(map) => map
            .remove(last)
            .ok_or_else(|| format!("no member {last:?}")),
        Value::Array(items) => {
            let i = array_index(last, items.len(), false)?;
            Ok(items.remove(i))
        }
        _ => Err(format!("{last:?}: not inside an object or array")),
    }
}

/// A string member of an operation, or an error naming it.
fn member<'a>(op: &'a Value, name: &str) -> Result<&'a str, String> {
    op[name]
        .as_str()
        .ok_or_else(|| format!("operation.{name}: expected a string, got {}", op[name]))
}

/// Applies one operation (`add`, `replace`, `remove`, `move`, `copy` or
/// `test`) to `doc`.
/// On an error `doc` may be left part-way (a `move` whose `add` fails has
/// removed its value): apply to a copy to keep the original.
pub fn apply_operation(doc: &mut Value, op: &Value) -> Result<(), String> {
    let path = pointer(member(op, "path")?)?;
    match member(op, "op")? {
        "add" => add(doc, &path, op["value"].clone(), true),
        "replace" => {
            *get_mut(doc, &path)? = op["value"].clone();
            Ok(())
        }
        "remove" => remove(doc, &path).map(drop),
        "move" => {
            let from = pointer(member(op, "from")?)?;
            let value = remove(doc, &from)?;
            add(doc, &path, value, false)
        }
        "copy" => {
            let from = pointer(member(op, "from")?)?;
            let value = get(doc, &from)?.clone();
            add(doc, &path, value, false)
        }
        "test" => test(doc, &path, &op["value"]),
        other => Err(format!("op {other:?} is not in the subset modelled here")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn apply(doc: &mut Value, op: Value) -> Result<(), String> {
        apply_operation(doc, &op)
    }

    #[test]
    fn pointers_unescape_tilde_and_slash() {
        assert_eq!(pointer(""), Ok(Vec::new()));
        assert_eq!(pointer("/"), Ok(vec![String::new()]));
        assert_eq!(
            pointer("/a~1b/m~0n/~01"),
            Ok(vec!["a/b".to_string(), "m~n".to_string(), "~1".to_string()])
        );
        assert!(pointer("a/b").is_err());
    }

    #[test]
    fn add_sets_a_member_inserts_into_an_array_and_appends_with_a_dash() {
        let mut doc = json!({"a": {"b": [1, 2]}});
        apply(
            &mut doc,
            json!({"op": "add", "path": "/a/c", "value": true}),
        )
        .unwrap();
        apply(
            &mut doc,
            json!({"op": "add", "path": "/a/c", "value": "again"}),
        )
        .unwrap();
        apply(&mut doc, json!({"op": "add", "path": "/a/b/0", "value": 0})).unwrap();
        apply(&mut doc, json!({"op": "add", "path": "/a/b/3", "value": 3})).unwrap();
        apply(&mut doc, json!({"op": "add", "path": "/a/b/-", "value": 4})).unwrap();
        assert_eq!(doc, json!({"a": {"b": [0, 1, 2, 3, 4], "c": "again"}}));
        apply(&mut doc, json!({"op": "add", "path": "", "value": [7]})).unwrap();
        assert_eq!(doc, json!([7]));
    }

    #[test]
    fn add_creates_missing_parents_as_arrays_before_an_index() {
        let mut doc = json!({});
        apply(&mut doc, json!({"op": "add", "path": "/o/k", "value": 1})).unwrap();
        apply(&mut doc, json!({"op": "add", "path": "/l/-", "value": 2})).unwrap();
        apply(&mut doc, json!({"op": "add", "path": "/m/0", "value": 3})).unwrap();
        assert_eq!(doc["o"], json!({"k": 1}));
        assert_eq!(doc["l"], json!([2]));
        assert_eq!(doc["m"], json!([3]));
    }

    #[test]
    fn add_refuses_an_index_past_the_end_and_a_scalar_parent() {
        let mut doc = json!({"a": [1], "s": "text"});
        for bad in [
            json!({"op": "add", "path": "/a/2", "value": 0}),
            json!({"op": "add", "path": "/a/x", "value": 0}),
            json!({"op": "add", "path": "/s/k", "value": 0}),
        ] {
            assert!(apply(&mut doc, bad.clone()).is_err(), "{bad}");
        }
        assert_eq!(doc, json!({"a": [1], "s": "text"}));
    }

    #[test]
    fn replace_needs_the_path_to_exist() {
        let mut doc = json!({"a": [1, 2], "b": {"c": 0}});
        apply(
            &mut doc,
            json!({"op": "replace", "path": "/a/1", "value": 9}),
        )
        .unwrap();
        apply(
            &mut doc,
            json!({"op": "replace", "path": "/b/c", "value": "x"}),
        )
        .unwrap();
        assert_eq!(doc, json!({"a": [1, 9], "b": {"c": "x"}}));
        for bad in [
            json!({"op": "replace", "path": "/nope", "value": 1}),
            json!({"op": "replace", "path": "/b/c/d", "value": 1}),
            json!({"op": "replace", "path": "/a/2", "value": 1}),
            json!({"op": "replace", "path": "/a/-", "value": 1}),
        ] {
            let err = apply(&mut doc, bad.clone()).unwrap_err();
            assert!(!err.is_empty(), "{bad}");
        }
        assert_eq!(doc, json!({"a": [1, 9], "b": {"c": "x"}}));
    }

    #[test]
    fn remove_takes_a_member_or_an_element_and_never_the_whole_document() {
        let mut doc = json!({"a": [1, 2, 3], "b": 0});
        apply(&mut doc, json!({"op": "remove", "path": "/a/0"})).unwrap();
        apply(&mut doc, json!({"op": "remove", "path": "/b"})).unwrap();
        assert_eq!(doc, json!({"a": [2, 3]}));
        for (bad, says) in [
            (json!({"op": "remove", "path": "/b"}), "no member \"b\""),
            (
                json!({"op": "remove", "path": "/a/2"}),
                "index 2 out of range",
            ),
            (json!({"op": "remove", "path": ""}), "whole document"),
        ] {
            let err = apply(&mut doc, bad.clone()).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
        let mut empty = json!({"a": []});
        assert!(apply(&mut empty, json!({"op": "remove", "path": "/a/0"})).is_err());
    }

    #[test]
    fn move_removes_then_adds_without_creating_parents() {
        let mut doc = json!({"a": [1, 2], "b": {}});
        apply(
            &mut doc,
            json!({"op": "move", "from": "/a/0", "path": "/b/first"}),
        )
        .unwrap();
        assert_eq!(doc, json!({"a": [2], "b": {"first": 1}}));
        let err = apply(
            &mut doc,
            json!({"op": "move", "from": "/nope", "path": "/c"}),
        )
        .unwrap_err();
        assert!(err.contains("no member \"nope\""), "{err}");
        // The value is taken before its destination is found missing.
        let err = apply(
            &mut doc,
            json!({"op": "move", "from": "/b/first", "path": "/n/p"}),
        )
        .unwrap_err();
        assert!(err.contains("no member \"n\""), "{err}");
        assert_eq!(doc, json!({"a": [2], "b": {}}));
    }

    #[test]
    fn copy_adds_a_deep_copy_without_creating_parents() {
        let mut doc = json!({"a": {"f": [{"n": 1}, {"n": 2}]}, "b": {"l": [0]}});
        apply(
            &mut doc,
            json!({"op": "copy", "from": "/a/f/1", "path": "/b/l/0"}),
        )
        .unwrap();
        assert_eq!(doc["b"]["l"], json!([{"n": 2}, 0]), "inserted before");
        // The copy is its own: changing it leaves the original.
        apply(
            &mut doc,
            json!({"op": "replace", "path": "/b/l/0/n", "value": 9}),
        )
        .unwrap();
        assert_eq!(doc["a"]["f"][1], json!({"n": 2}));
        apply(
            &mut doc,
            json!({"op": "copy", "from": "/a", "path": "/b/c"}),
        )
        .unwrap();
        assert_eq!(doc["b"]["c"], doc["a"]);
        let before = doc.clone();
        for (bad, says) in [
            (
                json!({"op": "copy", "from": "/a/f/2", "path": "/b/l/0"}),
                "index 2 out of range",
            ),
            (
                json!({"op": "copy", "from": "/a", "path": "/n/p"}),
                "no member \"n\"",
            ),
            (
                json!({"op": "copy", "from": "/a", "path": "/b/l/5"}),
                "index 5 out of range",
            ),
        ] {
            let err = apply(&mut doc, bad.clone()).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
        assert_eq!(doc, before);
    }

    #[test]
    fn test_compares_and_changes_nothing() {
        let mut doc = json!({"a": [{"name": "x"}], "n": null});
        for ok in [
            json!({"op": "test", "path": "/a/0/name", "value": "x"}),
            json!({"op": "test", "path": "/a", "value": [{"name": "x"}]}),
            json!({"op": "test", "path": "/missing", "value": null}),
            json!({"op": "test", "path": "", "value": {"a": [{"name": "x"}], "n": null}}),
        ] {
            apply(&mut doc, ok.clone()).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
        for bad in [
            json!({"op": "test", "path": "/a/0/name", "value": "y"}),
            json!({"op": "test", "path": "/a/1/name", "value": "x"}),
            json!({"op": "test", "path": "/missing", "value": 1}),
            json!({"op": "test", "path": "/n", "value": 0}),
        ] {
            assert!(apply(&mut doc, bad.clone()).is_err(), "{bad}");
        }
        assert_eq!(doc, json!({"a": [{"name": "x"}], "n": null}));
    }

    #[test]
    fn malformed_and_unknown_operations_are_errors() {
        let mut doc = json!({"a": 1});
        for (bad, says) in [
            (json!({"op": "add", "value": 1}), "operation.path"),
            (
                json!({"op": "add", "path": 3, "value": 1}),
                "operation.path",
            ),
            (json!({"path": "/a"}), "operation.op"),
            (json!({"op": "move", "path": "/b"}), "operation.from"),
            (
                json!({"op": "add", "path": "a", "value": 1}),
                "does not start with '/'",
            ),
            (json!({"op": "copy", "path": "/b"}), "operation.from"),
            (
                json!({"op": "merge", "path": "/a", "value": 1}),
                "\"merge\"",
            ),
        ] {
            let err = apply(&mut doc, bad.clone()).unwrap_err();
            assert!(err.contains(says), "{bad}: {err}");
        }
        assert_eq!(doc, json!({"a": 1}));
    }
}
