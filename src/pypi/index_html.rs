//! Pulling project names out of the PEP 503 HTML index, fed in arbitrary chunks.

use std::io;

use super::index_file::NameSink;

/// Pulls the text of every `<a ...>text</a>` out of HTML fed in arbitrary chunks.
#[derive(Default)]
pub(super) struct AnchorParser {
    state: HtmlState,
    tag: Vec<u8>,
    /// Inside `<!...>`: quotes mean nothing there.
    bang: bool,
    quote: Option<u8>,
    in_anchor: bool,
    text: Vec<u8>,
    text_overflow: bool,
}

#[derive(Default, Clone, Copy, PartialEq, Eq)]
enum HtmlState {
    #[default]
    Text,
    TagName,
    InTag,
}

impl AnchorParser {
    const MAX_TEXT: usize = 512;
    const MAX_TAG: usize = 16;

    pub(super) fn feed(&mut self, bytes: &[u8], sink: &mut NameSink<'_>) -> io::Result<()> {
        for &b in bytes {
            match self.state {
                HtmlState::Text => {
                    if b == b'<' {
                        if self.in_anchor {
                            self.in_anchor = false;
                            if !self.text_overflow {
                                if let Ok(text) = std::str::from_utf8(&self.text) {
                                    sink.push(text)?;
                                }
                            }
                        }
                        self.state = HtmlState::TagName;
                        self.tag.clear();
                        self.bang = false;
                    } else if self.in_anchor {
                        if self.text.len() < Self::MAX_TEXT {
                            self.text.push(b);
                        } else {
                            self.text_overflow = true;
                        }
                    }
                }
                HtmlState::TagName => {
                    if self.tag.is_empty() && b == b'!' {
                        self.bang = true;
                    }
                    if b == b'>' {
                        self.end_tag();
                    } else if b.is_ascii_whitespace() {
                        self.state = HtmlState::InTag;
                    } else if self.tag.len() < Self::MAX_TAG {
                        self.tag.push(b);
                    }
                }
                HtmlState::InTag => match self.quote {
                    Some(q) if b == q => self.quote = None,
                    Some(_) => {}
                    None if b == b'>' => self.end_tag(),
                    None if !self.bang && (b == b'"' || b == b'\'') => self.quote = Some(b),
                    None => {}
                },
            }
        }
        Ok(())
    }

    fn end_tag(&mut self) {
        self.state = HtmlState::Text;
        self.quote = None;
        if self.tag.eq_ignore_ascii_case(b"a") {
            self.in_anchor = true;
            self.text.clear();
            self.text_overflow = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anchor_parser_handles_split_chunks_and_odd_markup() {
        let html = b"<!-- <a>commented</a> don't --><A HREF='x>y'>First_One</A>\n<a\nhref=\"/b/\">second</a><abbr>nope</abbr><a>bad name!</a><a href=x>";
        let mut out = Vec::new();
        let mut sink = NameSink {
            out: &mut out,
            count: 0,
        };
        let mut parser = AnchorParser::default();
        for piece in html.chunks(3) {
            parser.feed(piece, &mut sink).expect("feed");
        }
        let count = sink.count;
        assert_eq!(String::from_utf8(out).expect("utf8"), "first-one\nsecond\n");
        assert_eq!(count, 2);
    }
}
