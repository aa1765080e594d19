//! Charts drawn by the server as inline SVG: no script, no external asset.

use maud::{html, Markup};

const WIDTH: f64 = 600.0;
const HEIGHT: f64 = 120.0;

/// A bar chart of `values` (one bar each, oldest first) with its maximum written beside it.
pub fn bars(label: &str, values: &[i64], colour: &str) -> Markup {
    let max = values.iter().copied().max().unwrap_or(0).max(1);
    let count = values.len().max(1);
    let step = WIDTH / count as f64;
    let bar_width = (step - 1.0).max(1.0);
    html! {
        svg.chart width=(WIDTH) height=(HEIGHT + 20.0) viewBox={ "0 0 " (WIDTH) " " (HEIGHT + 20.0) }
            role="img" aria-label=(label) xmlns="http://www.w3.org/2000/svg" {
            title { (label) }
            @for (index, value) in values.iter().enumerate() {
                @let height = HEIGHT * (*value as f64) / (max as f64);
                rect x=(format!("{:.1}", index as f64 * step)) y=(format!("{:.1}", HEIGHT - height))
                    width=(format!("{bar_width:.1}")) height=(format!("{height:.1}")) fill=(colour) {
                    title { (value) }
                }
            }
            // Closed explicitly: inline SVG is parsed as HTML, where `<line>` is no void
            // element, so an unclosed one would swallow the caption below and hide it.
            line x1="0" y1=(HEIGHT) x2=(WIDTH) y2=(HEIGHT) stroke="#888" {}
            text x="2" y=(HEIGHT + 15.0) font-size="11" fill="#333" {
                (label) ": max " (max) "/min, total " (values.iter().sum::<i64>())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bars_scale_to_the_largest_value_and_escape_the_label() {
        let svg = bars("<accepted>", &[0, 5, 10], "#123456").into_string();
        assert_eq!(svg.matches("<rect").count(), 3);
        assert!(svg.contains(r##"height="120.0" fill="#123456""##), "{svg}");
        assert!(svg.contains(r#"height="60.0""#));
        assert!(svg.contains("&lt;accepted&gt;: max 10/min, total 15"));
        assert!(!svg.contains("<accepted>"));
        assert!(
            svg.contains(r##"stroke="#888"></line><text "##),
            "the caption follows a closed line: {svg}"
        );
    }
}
