//! Plain-text tables for the terminal: columns padded to their widest cell.

/// The width of a column, in characters: that of its widest cell or of its header, whichever
/// is wider, so that `{:<width$}` lines every row of it up (names may hold non-ASCII text).
pub fn column_width<'a>(header: &str, cells: impl IntoIterator<Item = &'a str>) -> usize {
    cells
        .into_iter()
        .map(|c| c.chars().count())
        .fold(header.chars().count(), usize::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_widest_cell_or_the_header_in_characters() {
        assert_eq!(column_width("stage", ["a", "pretrain"]), 8);
        assert_eq!(column_width("stage", ["a"]), 5);
        assert_eq!(column_width("id", []), 2);
        assert_eq!(column_width("x", ["étape"]), 5);
    }
}
