//! The window's fonts: egui's own (with its emoji), then, as last resorts, fonts the system
//! already has for what egui's fonts lack: symbols small models write (arrows such as →,
//! maths, box drawing), the emoji added since Unicode 8 (🤔, 🤗, 🤖, 🧠: egui's emoji font
//! stops before them, and this model uses them often), and whatever is left. Bundling them
//! would add megabytes to the binary for what most desktops ship. Colour emoji fonts are no
//! use here: egui draws outlines only.

use std::sync::Arc;

use egui::{FontData, FontDefinitions, FontFamily};

/// For each kind of fallback, fonts where the common systems keep them; the first found of
/// each kind is used, in this order.
const FALLBACK_FONTS: &[(&str, &[&str])] = &[
    (
        "system symbols",
        &[
            // Debian, Ubuntu
            "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
            // Arch
            "/usr/share/fonts/TTF/DejaVuSans.ttf",
            // Fedora
            "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
            "/usr/share/fonts/dejavu/DejaVuSans.ttf",
            // macOS
            "/System/Library/Fonts/Supplemental/Arial Unicode.ttf",
            // Windows: Segoe UI Symbol
            "C:\\Windows\\Fonts\\seguisym.ttf",
        ],
    ),
    (
        "system emoji",
        &[
            // Debian, Ubuntu (fonts-symbola): emoji to Unicode 9, in outline
            "/usr/share/fonts/truetype/ancient-scripts/Symbola_hint.ttf",
            // Arch, Fedora
            "/usr/share/fonts/TTF/Symbola.ttf",
            "/usr/share/fonts/gdouros-symbola/Symbola.ttf",
            // Windows: Segoe UI Emoji, whose base glyphs are outlines beside its colour layers
            // (untested here)
            "C:\\Windows\\Fonts\\seguiemj.ttf",
        ],
    ),
    (
        "system unicode",
        &[
            // Debian, Ubuntu (fonts-unifont): every emoji to Unicode 15, as pixel outlines
            "/usr/share/fonts/opentype/unifont/unifont_upper.otf",
            // Arch, Fedora
            "/usr/share/fonts/unifont/unifont_upper.otf",
            "/usr/share/fonts/unifont/unifont_upper.ttf",
        ],
    ),
];

/// egui's fonts, and after them the first of each kind of [`FALLBACK_FONTS`] this system has.
pub fn with_system_fallbacks() -> FontDefinitions {
    let mut fonts = FontDefinitions::default();
    for (name, paths) in FALLBACK_FONTS {
        let Some(bytes) = paths.iter().find_map(|path| std::fs::read(path).ok()) else {
            continue;
        };
        let name = (*name).to_owned();
        fonts
            .font_data
            .insert(name.clone(), Arc::new(FontData::from_owned(bytes)));
        for family in [FontFamily::Proportional, FontFamily::Monospace] {
            fonts.families.entry(family).or_default().push(name.clone());
        }
    }
    fonts
}

#[cfg(test)]
mod tests {
    use super::with_system_fallbacks;

    /// The characters of `text` that `font` draws as boxes with the fallbacks installed.
    fn missing(text: &str, font: &egui::FontId) -> Vec<char> {
        let ctx = egui::Context::default();
        ctx.set_fonts(with_system_fallbacks());
        let mut output = ctx.run_ui(Default::default(), |_| {});
        output.textures_delta.clear();
        text.chars()
            .filter(|&c| !ctx.fonts_mut(|fonts| fonts.has_glyph(font, c)))
            .collect()
    }

    /// Arrows and symbols egui's fonts lack, from the system's font (CI installs DejaVu).
    #[test]
    fn arrows_and_symbols_have_glyphs_from_the_system_font() {
        for font in [
            egui::FontId::proportional(14.0),
            egui::FontId::monospace(14.0),
        ] {
            let missing = missing("→←↑↓⇒≤≥≠∞√∑±×÷°€£✓✗┌─┐", &font);
            assert!(missing.is_empty(), "{font:?} draws as boxes: {missing:?}");
        }
    }

    /// Emoji from Unicode 8 on, which egui's emoji font lacks, from the system's emoji and
    /// Unicode fonts (CI installs Symbola and Unifont).
    #[test]
    fn newer_emoji_have_glyphs_from_the_system_fonts() {
        let missing = missing(
            "🤔🤗🤩🧠🤣🤖🤓🙂🤯🥳🥰🥺🫶🪄",
            &egui::FontId::proportional(14.0),
        );
        assert!(missing.is_empty(), "drawn as boxes: {missing:?}");
    }
}
