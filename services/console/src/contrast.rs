//! The console's colours meet WCAG AA (4.5:1 for text) in the light and the dark scheme: the
//! stylesheet is parsed, every badge's text against its background, every chart legend colour
//! against the chart's and the page's background, and the page's own text pairs are checked
//! with the WCAG relative luminance, so a colour change that breaks contrast fails here.

use std::collections::HashMap;

const CSS: &str = include_str!("../assets/console.css");
/// WCAG AA for normal text.
const AA: f64 = 4.5;

/// The stylesheet without comments.
fn uncommented(css: &str) -> String {
    let mut out = String::new();
    let mut rest = css;
    while let Some(start) = rest.find("/*") {
        out.push_str(&rest[..start]);
        rest = rest[start..].find("*/").map_or("", |end| &rest[start + end + 2..]);
    }
    out.push_str(rest);
    out
}

/// The top-level blocks of `css`: `(prelude, body)`, nested bodies left whole.
fn blocks(css: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let (mut depth, mut prelude, mut body) = (0usize, String::new(), String::new());
    for c in css.chars() {
        match c {
            '{' => {
                if depth > 0 {
                    body.push(c);
                }
                depth += 1;
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    out.push((prelude.trim().to_string(), std::mem::take(&mut body)));
                    prelude.clear();
                } else {
                    body.push(c);
                }
            }
            _ if depth == 0 => prelude.push(c),
            _ => body.push(c),
        }
    }
    out
}

/// `property: value` pairs of a rule's body.
fn declarations(body: &str) -> HashMap<String, String> {
    body.split(';')
        .filter_map(|d| d.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect()
}

/// The custom properties of each scheme: the light set of `:root`, the dark set overriding it.
fn schemes(css: &str) -> [(&'static str, HashMap<String, String>); 2] {
    let mut light = HashMap::new();
    let mut dark_overrides = HashMap::new();
    for (prelude, body) in blocks(css) {
        if prelude == ":root" {
            light.extend(declarations(&body).into_iter().filter(|(k, _)| k.starts_with("--")));
        } else if prelude.starts_with("@media") && prelude.contains("prefers-color-scheme: dark") {
            for (inner, inner_body) in blocks(&body) {
                if inner == ":root" {
                    dark_overrides.extend(declarations(&inner_body));
                }
            }
        }
    }
    let mut dark = light.clone();
    dark.extend(dark_overrides);
    [("light", light), ("dark", dark)]
}

/// A colour value (`#rgb`, `#rrggbb` or `var(--name)`) as RGB in a scheme.
fn rgb(value: &str, vars: &HashMap<String, String>) -> [u8; 3] {
    let value = value.trim();
    if let Some(name) = value.strip_prefix("var(").and_then(|v| v.strip_suffix(')')) {
        let resolved = vars.get(name.trim()).unwrap_or_else(|| panic!("{name} is not defined"));
        return rgb(resolved, vars);
    }
    let hex = value.strip_prefix('#').unwrap_or_else(|| panic!("{value}: not a #hex colour"));
    let hex: String = if hex.len() == 3 { hex.chars().flat_map(|c| [c, c]).collect() } else { hex.into() };
    let byte = |n: usize| u8::from_str_radix(&hex[n..n + 2], 16).unwrap_or_else(|_| panic!("{value}"));
    [byte(0), byte(2), byte(4)]
}

/// WCAG 2 relative luminance.
fn luminance([r, g, b]: [u8; 3]) -> f64 {
    let channel = |c: u8| {
        let c = f64::from(c) / 255.0;
        if c <= 0.03928 { c / 12.92 } else { ((c + 0.055) / 1.055).powf(2.4) }
    };
    0.2126 * channel(r) + 0.7152 * channel(g) + 0.0722 * channel(b)
}

fn ratio(a: [u8; 3], b: [u8; 3]) -> f64 {
    let (a, b) = (luminance(a), luminance(b));
    (a.max(b) + 0.05) / (a.min(b) + 0.05)
}

/// Every (what, foreground, background) pair the pages show text or a legend in.
fn pairs(css: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for (selector, body) in blocks(css) {
        if selector.starts_with('@') {
            continue;
        }
        let decls = declarations(&body);
        if selector.contains(".badge")
            && let (Some(fg), Some(bg)) = (decls.get("color"), decls.get("background"))
        {
            out.push((selector.clone(), fg.clone(), bg.clone()));
        }
        if selector.contains(".key-")
            && let Some(fg) = decls.get("color")
        {
            for bg in ["var(--panel)", "var(--bg)"] {
                out.push((selector.clone(), fg.clone(), bg.to_string()));
            }
        }
    }
    for (fg, bg) in [
        ("--fg", "--bg"),
        ("--fg", "--panel"),
        ("--fg", "--panel-2"),
        ("--muted", "--bg"),
        ("--muted", "--panel"),
        ("--accent", "--bg"),
        ("--accent", "--panel"),
        ("--bad", "--panel"),
        ("--bad", "--error-bg"),
        ("--button-fg", "--button"),
        ("--danger-fg", "--danger"),
        ("--header-fg", "--header"),
        ("--header-link", "--header"),
    ] {
        out.push((format!("{fg} on {bg}"), format!("var({fg})"), format!("var({bg})")));
    }
    out
}

#[test]
fn every_badge_legend_and_text_colour_meets_wcag_aa_in_both_schemes() {
    let css = uncommented(CSS);
    let pairs = pairs(&css);
    let badges = pairs.iter().filter(|(what, _, _)| what.contains(".badge")).count();
    let legends = pairs.iter().filter(|(what, _, _)| what.contains(".key-")).count();
    assert!(
        badges >= 4 && legends >= 10,
        "the stylesheet's badges ({badges}) and legends ({legends}) were found"
    );
    let mut failing = Vec::new();
    for (scheme, vars) in schemes(&css) {
        assert!(vars.contains_key("--bg"), "{scheme} scheme parsed: {vars:?}");
        for (what, fg, bg) in &pairs {
            let contrast = ratio(rgb(fg, &vars), rgb(bg, &vars));
            if contrast < AA {
                failing.push(format!("{scheme}: {what}: {fg} on {bg} is {contrast:.2}:1"));
            }
        }
    }
    assert!(failing.is_empty(), "below {AA}:1:\n{}", failing.join("\n"));
}

#[test]
fn the_contrast_check_knows_a_bad_pair_when_it_sees_one() {
    // WCAG's own examples: black on white is 21:1; the old legend blue on white is not AA.
    let vars = HashMap::new();
    assert!((ratio(rgb("#000", &vars), rgb("#fff", &vars)) - 21.0).abs() < 1e-9);
    assert!(ratio(rgb("#7aa2ff", &vars), rgb("#ffffff", &vars)) < AA);
    let css = ":root { --bg: #fff; --x: #7aa2ff; }\n.key-x { color: var(--x); }";
    let light = &schemes(css)[0].1;
    let bad: Vec<_> = pairs(css)
        .into_iter()
        .filter(|(what, ..)| what == ".key-x")
        .map(|(_, fg, _)| rgb(&fg, light))
        .collect();
    assert!(ratio(bad[0], rgb("var(--bg)", light)) < AA);
}
