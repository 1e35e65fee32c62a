//! SVG charts with plotters' SVG backend: lines (CDFs, sweeps) and bars. Every chart has a
//! title, axis labels with units and a legend naming its series, so a reader (and a test) can
//! tell what is plotted.

use plotters::prelude::*;

/// One named series of (x, y) points.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Draw a marker at every point (sparse series: sweeps).
    pub markers: bool,
}

const WIDTH: u32 = 560;
const HEIGHT: u32 = 360;

fn color(i: usize) -> RGBColor {
    // Colour-blind-friendly (Okabe–Ito), then plotters' palette.
    const OKABE_ITO: [RGBColor; 8] = [
        RGBColor(0, 114, 178),
        RGBColor(213, 94, 0),
        RGBColor(0, 158, 115),
        RGBColor(204, 121, 167),
        RGBColor(230, 159, 0),
        RGBColor(86, 180, 233),
        RGBColor(120, 120, 120),
        RGBColor(240, 228, 66),
    ];
    if i < OKABE_ITO.len() {
        OKABE_ITO[i]
    } else {
        let c = Palette99::pick(i).to_rgba();
        RGBColor(c.0, c.1, c.2)
    }
}

fn span(values: impl Iterator<Item = f64>, from_zero: bool) -> (f64, f64) {
    let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
    for v in values.filter(|v| v.is_finite()) {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    if from_zero {
        lo = lo.min(0.0);
    }
    let pad = if hi > lo { (hi - lo) * 0.05 } else { hi.abs().max(1.0) * 0.1 };
    (if from_zero && lo >= 0.0 { lo } else { lo - pad }, hi + pad)
}

fn err(e: impl std::fmt::Display) -> String {
    format!("cannot draw the chart: {e}")
}

/// A line chart of `series` (a CDF when `y` is a cumulative share).
pub fn lines(
    title: &str,
    x_label: &str,
    y_label: &str,
    series: &[Series],
    y_from_zero: bool,
) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let (x0, x1) = span(series.iter().flat_map(|s| s.points.iter().map(|p| p.0)), false);
        let (y0, y1) = span(series.iter().flat_map(|s| s.points.iter().map(|p| p.1)), y_from_zero);
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(42)
            .y_label_area_size(62)
            .build_cartesian_2d(x0..x1, y0..y1)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(err)?;
        for (i, s) in series.iter().enumerate() {
            let c = color(i);
            chart
                .draw_series(LineSeries::new(s.points.iter().copied(), c.stroke_width(2)))
                .map_err(err)?
                .label(s.name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2)));
            if s.markers {
                chart.draw_series(s.points.iter().map(|&(x, y)| Circle::new((x, y), 3, c.filled()))).map_err(err)?;
            }
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(RGBColor(160, 160, 160))
            .position(SeriesLabelPosition::LowerRight)
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// A bar chart: one bar per named category, its value written above it.
pub fn bars(
    title: &str,
    y_label: &str,
    bars: &[(String, f64)],
    value_fmt: fn(f64) -> String,
) -> Result<String, String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (WIDTH, HEIGHT)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let n = bars.len().max(1) as i32;
        let y1 = bars.iter().map(|b| b.1).filter(|v| v.is_finite()).fold(0.0, f64::max).max(1e-9) * 1.15;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(42)
            .y_label_area_size(62)
            // A segmented range a..b has a slot for b too: n bars need 0..n-1.
            .build_cartesian_2d((0..(n - 1).max(1)).into_segmented(), 0.0..y1)
            .map_err(err)?;
        let names: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
        let label = move |v: &SegmentValue<i32>| match v {
            SegmentValue::CenterOf(i) => names.get(*i as usize).cloned().unwrap_or_default(),
            _ => String::new(),
        };
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(bars.len().max(1))
            .x_label_formatter(&label)
            .x_label_style(("sans-serif", 11))
            .y_desc(y_label)
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(err)?;
        for (i, (_, v)) in bars.iter().enumerate() {
            let i = i as i32;
            let c = color(i as usize);
            let mut bar =
                Rectangle::new([(SegmentValue::Exact(i), 0.0), (SegmentValue::Exact(i + 1), *v)], c.mix(0.85).filled());
            bar.set_margin(0, 0, 14, 14);
            chart.draw_series(std::iter::once(bar)).map_err(err)?;
            chart
                .draw_series(std::iter::once(Text::new(
                    value_fmt(*v),
                    (SegmentValue::<i32>::CenterOf(i), *v + y1 * 0.02),
                    ("sans-serif", 12).into_font().color(&BLACK),
                )))
                .map_err(err)?;
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}
