//! The window's fonts: egui's own (with its emoji), then, as the last resort, a font the
//! system already has for the symbols small models write that egui's fonts lack (arrows
//! such as →, maths, box drawing). Bundling one would add a megabyte to the binary for what
//! almost every desktop ships.

use std::sync::Arc;

use egui::{FontData, FontDefinitions, FontFamily};

/// Fonts with wide symbol coverage, where the common systems keep them; the first found is
/// used.
const SYMBOL_FONTS: &[&str] = &[
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
];

/// egui's fonts, and the first of [`SYMBOL_FONTS`] this system has after them.
pub fn with_system_symbols() -> FontDefinitions {
    let mut fonts = FontDefinitions::default();
    if let Some(bytes) = SYMBOL_FONTS
        .iter()
        .find_map(|path| std::fs::read(path).ok())
    {
        let name = "system symbols".to_owned();
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
    use super::with_system_symbols;

    /// Arrows and symbols egui's fonts lack, from the system's font (CI installs DejaVu).
    #[test]
    fn arrows_and_symbols_have_glyphs_from_the_system_font() {
        let ctx = egui::Context::default();
        ctx.set_fonts(with_system_symbols());
        let mut output = ctx.run_ui(Default::default(), |_| {});
        output.textures_delta.clear();
        for family in [
            egui::FontId::proportional(14.0),
            egui::FontId::monospace(14.0),
        ] {
            let missing: Vec<char> = "→←↑↓⇒≤≥≠∞√∑±×÷°€£✓✗┌─┐"
                .chars()
                .filter(|&c| !ctx.fonts_mut(|fonts| fonts.has_glyph(&family, c)))
                .collect();
            assert!(missing.is_empty(), "{family:?} draws as boxes: {missing:?}");
        }
    }
}
