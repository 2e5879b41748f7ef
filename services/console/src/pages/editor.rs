//! The spec editor (`/tasks/new`, `/tasks/<ns>/<id>/edit`): the spec as JSON in a textarea,
//! every problem of the last attempt above it, and after a conflict the version someone else
//! saved.

use maud::{Markup, html};

use super::{Ctx, layout, task_href};

/// What the editor shows.
pub(crate) struct Editor<'a> {
    /// The task edited (`None`: a new one).
    pub(crate) task: Option<(&'a str, &'a str)>,
    /// The revision the form was loaded with: the save is stored only over it.
    pub(crate) revision: Option<u64>,
    /// The spec's text: the stored spec, or what the operator wrote.
    pub(crate) text: String,
    /// Every problem of the last attempt.
    pub(crate) problems: &'a [String],
    /// After a conflict: the revision someone else saved, and its spec.
    pub(crate) theirs: Option<(u64, String)>,
}

pub(crate) fn page(ctx: &Ctx, editor: &Editor<'_>) -> Markup {
    let (title, target) = match editor.task {
        Some((namespace, id)) => {
            (format!("Edit {namespace}/{id}"), format!("{}/edit", task_href(namespace, id)))
        }
        None => ("New task".to_string(), "/tasks/new".to_string()),
    };
    let body = html! {
        @if let Some((namespace, id)) = editor.task {
            p.sub { a href=(task_href(namespace, id)) { "← " (namespace) "/" (id) }
                @if let Some(revision) = editor.revision { " · editing revision " span #editor-revision { (revision) } } }
        }
        @if !editor.problems.is_empty() {
            div.error #form-problems role="alert" {
                p { (editor.problems.len()) (if editor.problems.len() == 1 { " problem" } else { " problems" }) ", nothing was stored:" }
                ul { @for problem in editor.problems { li { (problem) } } }
            }
        }
        form.editor method="post" action=(target) {
            input type="hidden" name="csrf" value=(ctx.csrf);
            @if let Some(revision) = editor.revision { input type="hidden" name="revision" value=(revision); }
            label for="spec" { "Spec (JSON, as " code { "jetsched apply" } " takes it)" }
            textarea #spec name="spec" rows="24" cols="90" spellcheck="false" { (editor.text) }
            p {
                button type="submit" disabled[!ctx.allow_actions]
                    title=[(!ctx.allow_actions).then_some("actions are off: start the console with --allow-actions")]
                    { (if editor.task.is_some() { "Save" } else { "Create" }) }
            }
        }
        @if let Some((revision, spec)) = &editor.theirs {
            section #their-version {
                h2 { "Their version (revision " (revision) ")" }
                pre.spec { code { (spec) } }
            }
        }
    };
    layout(&title, "/tasks", body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_editor_keeps_the_text_escaped_and_lists_every_problem() {
        let ctx = Ctx { csrf: "c".into(), allow_actions: true };
        let problems = ["schedule.every: <bad>".to_string(), "timeout: bad".to_string()];
        let editor = Editor {
            task: Some(("ns", "t")),
            revision: Some(4),
            text: "{\"x\": \"</textarea><b>\"}".into(),
            problems: &problems,
            theirs: Some((5, "{}".into())),
        };
        let html = page(&ctx, &editor).into_string();
        assert!(!html.contains("</textarea><b>") && html.contains("&lt;/textarea&gt;&lt;b&gt;"), "{html}");
        assert!(html.contains("2 problems") && html.contains("&lt;bad&gt;"), "{html}");
        assert!(html.contains(r#"name="revision" value="4""#) && html.contains("/tasks/ns/t/edit"), "{html}");
        assert!(html.contains("Their version (revision 5)"), "{html}");
    }
}
