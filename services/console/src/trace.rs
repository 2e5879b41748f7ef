//! Links from a run's trace id to a tracing UI (`--trace-url`, a template with `{trace_id}`):
//! the template checked once at start, and the link it makes.

use std::sync::Arc;

use maud::{Markup, html};

/// The placeholder a trace URL template must contain.
pub(crate) const PLACEHOLDER: &str = "{trace_id}";

/// Where trace ids link to; `None` when no `--trace-url` is set (no link is shown).
#[derive(Debug, Clone, Default)]
pub(crate) struct TraceLinks(Option<Arc<str>>);

impl TraceLinks {
    /// Links made from `template` (already checked by [`problem`]).
    pub(crate) fn new(template: Option<&str>) -> TraceLinks {
        TraceLinks(template.map(Arc::from))
    }

    /// The URL of `trace_id`'s trace, when a template is set. A trace id is 32 hex digits; an
    /// execution id (a UUID) stands for its trace as its 128 bits in hex, as the services derive
    /// it. Nothing to encode (escaped anyway as an attribute).
    pub(crate) fn url(&self, trace_id: &str) -> Option<String> {
        let trace_id = match uuid::Uuid::parse_str(trace_id) {
            Ok(uuid) => uuid.simple().to_string(),
            Err(_) => trace_id.to_string(),
        };
        self.0.as_deref().map(|template| template.replace(PLACEHOLDER, &trace_id))
    }

    /// ` trace` linked to `trace_id`'s trace, or nothing.
    pub(crate) fn link(&self, trace_id: &str) -> Markup {
        html! {
            @if let Some(url) = self.url(trace_id) {
                " " a.trace href=(url) rel="noopener noreferrer" target="_blank" title={"trace " (trace_id)} { "trace" }
            }
        }
    }
}

/// What is wrong with a `--trace-url` template, if anything: it must be an absolute http or
/// https URL with a host and contain `{trace_id}`.
pub(crate) fn problem(template: &str) -> Option<String> {
    let mut wrong = Vec::new();
    let rest = template.strip_prefix("https://").or_else(|| template.strip_prefix("http://"));
    match rest {
        None => wrong.push("must start with http:// or https://".to_string()),
        Some(rest) => {
            let host = rest.split(['/', '?', '#']).next().unwrap_or_default();
            if host.is_empty() || host.starts_with(':') || host.contains(PLACEHOLDER) {
                wrong.push("must name a host".to_string());
            }
        }
    }
    if !template.contains(PLACEHOLDER) {
        wrong.push(format!("must contain {PLACEHOLDER}"));
    }
    if template.chars().any(|c| c.is_whitespace() || c.is_control() || matches!(c, '"' | '<' | '>')) {
        wrong.push("must not contain spaces, quotes or angle brackets".to_string());
    }
    (!wrong.is_empty()).then(|| wrong.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_are_checked_and_filled() {
        assert_eq!(problem("http://jaeger:16686/trace/{trace_id}"), None);
        assert_eq!(problem("https://grafana.example/explore?trace={trace_id}&x=1"), None);
        assert_eq!(
            problem("jaeger:16686/trace").as_deref(),
            Some("must start with http:// or https://; must contain {trace_id}")
        );
        assert_eq!(problem("http:///trace/{trace_id}").as_deref(), Some("must name a host"));
        assert_eq!(problem("ftp://x/{trace_id}").as_deref(), Some("must start with http:// or https://"));
        assert!(problem("http://x/{trace_id} y").is_some());
        let links = TraceLinks::new(Some("http://jaeger:16686/trace/{trace_id}"));
        assert_eq!(links.url("abc").as_deref(), Some("http://jaeger:16686/trace/abc"));
        assert_eq!(
            links.url("0af76519-16cd-43dd-8448-eb211c80319c").as_deref(),
            Some("http://jaeger:16686/trace/0af7651916cd43dd8448eb211c80319c"),
            "an execution id stands for its trace"
        );
        assert!(links.link("abc").into_string().contains(r#"href="http://jaeger:16686/trace/abc""#));
        assert_eq!(TraceLinks::default().link("abc").into_string(), "");
    }
}
