//! Markdown → ratatui lines, already wrapped to a width, for the chat transcript.
//!
//! The caller gets plain `Line`s so it can count them for scrolling and cache them per
//! message and width. Parsing is pulldown-cmark (CommonMark + GFM tables, strikethrough,
//! task lists); fenced code is highlighted by syntect in colour themes. Everything that
//! comes from the model is untrusted: control characters are shown as escapes, never sent
//! to the terminal. Widths are display widths (graphemes, wide characters count two).

use std::borrow::Cow;
use std::sync::OnceLock;

use pulldown_cmark::{Alignment, CodeBlockKind, Event, HeadingLevel, Options, Parser, Tag, TagEnd};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use syntect::easy::HighlightLines;
use syntect::highlighting::{FontStyle, ThemeSet};
use syntect::parsing::SyntaxSet;
use syntect::util::LinesWithEndings;
use unicode_segmentation::UnicodeSegmentation;
use unicode_width::UnicodeWidthStr;

use crate::theme::Theme;

/// How a reply is rendered beyond the Markdown itself.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MdOptions<'a> {
    /// Show the thinking block (`<think>…</think>` at the start of a reply) in full
    /// instead of one folded line.
    pub expand_thinking: bool,
    /// The reply begins inside a thinking block without the opening tag: the chat
    /// template ended the prompt with `<think>` (DeepSeek-R1 style), so only `</think>`
    /// will appear.
    pub thinking_open: bool,
    /// The key that toggles the thinking block, named in its line (`press t to expand`);
    /// empty names none.
    pub toggle_key: &'a str,
}

/// One fenced or indented code block of a reply, for copying.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodeBlock {
    /// The first word of the fence's info string (`rust` of ```` ```rust,ignore ````).
    pub lang: Option<String>,
    /// The code as written, ending with a newline unless the fence was never closed.
    pub code: String,
}

/// Highlighting costs grow with the code and fancy-regex can be slow on long lines; past
/// these sizes a block is shown plain so a re-render while streaming stays cheap.
const HIGHLIGHT_MAX_BYTES: usize = 64 * 1024;
const HIGHLIGHT_MAX_LINE: usize = 2048;
/// syntect theme for colour themes (the workbench's themes are dark).
const SYNTAX_THEME: &str = "base16-ocean.dark";
const BULLETS: [&str; 3] = ["• ", "◦ ", "▪ "];

/// `text` as lines of at most `width` columns. Wrapping is done here (words, with long
/// words broken and hanging indents in lists), so the result can be counted and must be
/// re-rendered when the width changes. A leading thinking block is folded into one line
/// unless `opts.expand_thinking`.
pub fn render(text: &str, width: u16, theme: &Theme, opts: &MdOptions) -> Vec<Line<'static>> {
    let w = width as usize;
    if w == 0 {
        return Vec::new();
    }
    let text = normalize(text);
    let (thinking, answer) = split(&text, opts.thinking_open);
    let mut out = Vec::new();
    if let Some((thought, closed)) = thinking {
        let style = theme.dim.add_modifier(Modifier::ITALIC);
        let words = thought.split_whitespace().count();
        let mut head = format!(
            "{} thinking{} ({words} word{})",
            if opts.expand_thinking { '▾' } else { '▸' },
            if closed { "" } else { "…" },
            if words == 1 { "" } else { "s" },
        );
        if !opts.toggle_key.is_empty() {
            let what = if opts.expand_thinking {
                "fold"
            } else {
                "expand"
            };
            head.push_str(&format!(" — press {} to {what}", clean(opts.toggle_key)));
        }
        out.push(Line::from(Span::styled(head, style)));
        if opts.expand_thinking {
            let mut md = Md::new(w, theme, style, false);
            md.bars.push(Container::bar("┊ ", theme.dim));
            md.run(thought);
            out.extend(md.out);
        }
        if !answer.trim().is_empty() {
            out.push(Line::default());
        }
    }
    let mut md = Md::new(w, theme, theme.base, true);
    md.run(answer);
    out.extend(md.out);
    for line in &mut out {
        clamp(line, w);
    }
    out
}

/// Text shown as written (a user's message): escaped, wrapped to `width`, newlines kept,
/// leading indentation kept, trailing blank lines dropped.
pub fn render_plain(text: &str, width: u16, style: Style) -> Vec<Line<'static>> {
    let w = width as usize;
    if w == 0 {
        return Vec::new();
    }
    let text = normalize(text);
    let mut pieces = Vec::new();
    for (i, part) in text.trim_end().split('\n').enumerate() {
        if i > 0 {
            pieces.push(Piece::Break);
        }
        pieces.push(Piece::Text(clean(part), style));
    }
    let mut out: Vec<Line<'static>> = wrap(&pieces, w).into_iter().map(Line::from).collect();
    for line in &mut out {
        clamp(line, w);
    }
    out
}

/// The code blocks of a reply's answer, in the order [`render`] numbers them (`#1`, …).
/// A leading `<think>…</think>` block is skipped; pass the answer part of
/// [`split_thinking`] when the prompt opened the thinking block.
pub fn code_blocks(text: &str) -> Vec<CodeBlock> {
    let text = normalize(text);
    let (_, answer) = split(&text, false);
    let mut blocks = Vec::new();
    let mut cur: Option<CodeBlock> = None;
    for ev in Parser::new_ext(answer, options()) {
        match ev {
            Event::Start(Tag::CodeBlock(kind)) => {
                cur = Some(CodeBlock {
                    lang: fence_lang(&kind),
                    code: String::new(),
                })
            }
            Event::Text(t) => {
                if let Some(c) = &mut cur {
                    c.code.push_str(&t);
                }
            }
            Event::End(TagEnd::CodeBlock) => blocks.extend(cur.take()),
            _ => {}
        }
    }
    blocks.extend(cur);
    blocks
}

/// A reply split into its leading thinking block (without the tags; `None` when there is
/// none) and the answer after `</think>`. An unterminated block takes the whole text.
pub fn split_thinking(text: &str, thinking_open: bool) -> (Option<&str>, &str) {
    let (t, a) = split(text, thinking_open);
    (t.map(|(t, _)| t), a)
}

/// [`split_thinking`] plus whether the block was closed.
fn split(text: &str, open: bool) -> (Option<(&str, bool)>, &str) {
    let body = match text.trim_start().strip_prefix("<think>") {
        Some(rest) => rest,
        None if open => text,
        None => return (None, text),
    };
    match body.find("</think>") {
        Some(i) => (Some((&body[..i], true)), &body[i + "</think>".len()..]),
        None => (Some((body, false)), ""),
    }
}

fn normalize(text: &str) -> Cow<'_, str> {
    if text.contains('\r') {
        Cow::Owned(text.replace("\r\n", "\n"))
    } else {
        Cow::Borrowed(text)
    }
}

fn options() -> Options {
    Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TASKLISTS
}

fn fence_lang(kind: &CodeBlockKind) -> Option<String> {
    match kind {
        CodeBlockKind::Fenced(info) => info
            .split(|c: char| c.is_whitespace() || c == ',' || c == '{')
            .next()
            .filter(|s| !s.is_empty())
            .map(|s| s.to_string()),
        CodeBlockKind::Indented => None,
    }
}

/// Untrusted text made safe to print: control characters (and bidi overrides, which
/// reorder what follows them) as escapes, tabs as four spaces.
pub(crate) fn clean(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '\t' => out.push_str("    "),
            '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}' => out.extend(c.escape_default()),
            c if c.is_control() => out.extend(c.escape_default()),
            c => out.push(c),
        }
    }
    out
}

/// Display width as ratatui's buffer counts it: per grapheme.
pub(crate) fn width_of(s: &str) -> usize {
    s.graphemes(true).map(UnicodeWidthStr::width).sum()
}

/// Cuts a line to `width` columns (a last guard: wrapping already fits, but ratatui
/// measures whole spans and may count a grapheme sequence wider than its parts).
pub(crate) fn clamp(line: &mut Line<'static>, width: usize) {
    if line.width() <= width {
        return;
    }
    let mut used = 0;
    let mut spans: Vec<Span<'static>> = Vec::new();
    'outer: for span in line.spans.drain(..) {
        let mut s = String::new();
        for g in span.content.graphemes(true) {
            let gw = UnicodeWidthStr::width(g);
            if used + gw > width {
                if !s.is_empty() {
                    spans.push(Span::styled(s, span.style));
                }
                break 'outer;
            }
            used += gw;
            s.push_str(g);
        }
        spans.push(Span::styled(s, span.style));
    }
    line.spans = spans;
    while line.width() > width {
        let Some(last) = line.spans.last_mut() else {
            break;
        };
        let mut s = last.content.to_string();
        match s.grapheme_indices(true).next_back() {
            Some((i, _)) => s.truncate(i),
            None => s.clear(),
        }
        if s.is_empty() {
            line.spans.pop();
        } else {
            last.content = Cow::Owned(s);
        }
    }
}

/// Inline content on its way to the wrapper: styled text (already cleaned) or a hard
/// line break.
#[derive(Clone, Debug)]
pub(crate) enum Piece {
    Text(String, Style),
    Break,
}

/// Word-wraps pieces to `width` columns (at least 1): breaks at spaces, breaks words
/// longer than a line, drops the spaces at a wrap and keeps them after a hard break (so
/// indentation survives).
pub(crate) fn wrap(pieces: &[Piece], width: usize) -> Vec<Vec<Span<'static>>> {
    let mut w = Wrapper::new(width.max(1));
    for p in pieces {
        match p {
            Piece::Text(s, style) => {
                for g in s.graphemes(true) {
                    w.push(g, *style);
                }
            }
            Piece::Break => w.hard_break(),
        }
    }
    w.finish()
}

type Frags = Vec<(String, Style)>;

fn push_frag(v: &mut Frags, s: &str, style: Style) {
    match v.last_mut() {
        Some((t, st)) if *st == style => t.push_str(s),
        _ => v.push((s.to_string(), style)),
    }
}

struct Wrapper {
    width: usize,
    lines: Vec<Vec<Span<'static>>>,
    cur: Frags,
    cur_w: usize,
    word: Frags,
    word_w: usize,
    space: Frags,
    space_w: usize,
    /// The current line began at a wrap, where spaces are dropped.
    after_wrap: bool,
    /// The word is the rest of one already broken: it goes on where that one stopped.
    cont: bool,
}

impl Wrapper {
    fn new(width: usize) -> Wrapper {
        Wrapper {
            width,
            lines: Vec::new(),
            cur: Vec::new(),
            cur_w: 0,
            word: Vec::new(),
            word_w: 0,
            space: Vec::new(),
            space_w: 0,
            after_wrap: false,
            cont: false,
        }
    }

    fn push(&mut self, g: &str, style: Style) {
        let mut gw = UnicodeWidthStr::width(g);
        let g = if gw > self.width {
            // A wide character in a one-column line cannot be shown.
            gw = 1;
            "…"
        } else {
            g
        };
        if g.chars().all(char::is_whitespace) {
            self.commit_word();
            self.cont = false;
            push_frag(&mut self.space, g, style);
            self.space_w += gw;
        } else {
            push_frag(&mut self.word, g, style);
            self.word_w += gw;
            if self.word_w > self.width {
                // Never fits: place what we have now rather than buffering a huge word.
                self.commit_word();
                self.cont = true;
            }
        }
    }

    fn newline(&mut self, wrapped: bool) {
        let cur = std::mem::take(&mut self.cur);
        self.lines
            .push(cur.into_iter().map(|(s, st)| Span::styled(s, st)).collect());
        self.cur_w = 0;
        self.space.clear();
        self.space_w = 0;
        self.after_wrap = wrapped;
    }

    fn append(&mut self, frags: Frags, w: usize) {
        for (s, st) in frags {
            push_frag(&mut self.cur, &s, st);
        }
        self.cur_w += w;
    }

    fn commit_word(&mut self) {
        if self.word.is_empty() {
            return;
        }
        let word = std::mem::take(&mut self.word);
        let word_w = std::mem::replace(&mut self.word_w, 0);
        let space = std::mem::take(&mut self.space);
        let space_w = std::mem::replace(&mut self.space_w, 0);
        let keep_space = !self.cur.is_empty() || !self.after_wrap;
        let sw = if keep_space { space_w } else { 0 };
        let broken = word_w > self.width || (self.cont && space_w == 0);
        if self.cur_w + sw + word_w <= self.width {
            if keep_space {
                self.append(space, space_w);
            }
            self.append(word, word_w);
        } else if !broken {
            if !self.cur.is_empty() {
                self.newline(true);
            }
            self.append(word, word_w);
        } else {
            // Longer than a line: start it after the space if any room is left (long
            // URLs), else on a new line; a continuation (no space) just goes on.
            if keep_space && space_w > 0 && self.cur_w + sw < self.width {
                self.append(space, space_w);
            } else if !self.cur.is_empty() && space_w > 0 {
                self.newline(true);
            }
            for (s, st) in word {
                for g in s.graphemes(true) {
                    let gw = UnicodeWidthStr::width(g).min(self.width);
                    if self.cur_w + gw > self.width {
                        self.newline(true);
                    }
                    push_frag(&mut self.cur, g, st);
                    self.cur_w += gw;
                }
            }
        }
    }

    fn hard_break(&mut self) {
        self.commit_word();
        self.cont = false;
        self.newline(false);
    }

    fn finish(mut self) -> Vec<Vec<Span<'static>>> {
        self.commit_word();
        if !self.cur.is_empty() {
            self.newline(false);
        }
        self.lines
    }
}

/// syntect's grammars and themes, loaded once (a cache: the result never changes).
fn syntax_assets() -> &'static (SyntaxSet, ThemeSet) {
    static ASSETS: OnceLock<(SyntaxSet, ThemeSet)> = OnceLock::new();
    ASSETS.get_or_init(|| {
        (
            SyntaxSet::load_defaults_newlines(),
            ThemeSet::load_defaults(),
        )
    })
}

/// The code's lines as highlighted fragments, or `None` for an unknown language, a block
/// too large, or a grammar error.
fn highlight(lang: &str, code: &str) -> Option<Vec<Frags>> {
    if code.len() > HIGHLIGHT_MAX_BYTES || code.lines().any(|l| l.len() > HIGHLIGHT_MAX_LINE) {
        return None;
    }
    let (ss, ts) = syntax_assets();
    let syntax = ss.find_syntax_by_token(lang)?;
    let theme = ts.themes.get(SYNTAX_THEME)?;
    let mut h = HighlightLines::new(syntax, theme);
    let mut out = Vec::new();
    for line in LinesWithEndings::from(code) {
        let mut frags = Vec::new();
        for (st, s) in h.highlight_line(line, ss).ok()? {
            let s = s.trim_end_matches(['\n', '\r']);
            if s.is_empty() {
                continue;
            }
            let fg = st.foreground;
            let mut style = Style::default().fg(Color::Rgb(fg.r, fg.g, fg.b));
            if st.font_style.contains(FontStyle::BOLD) {
                style = style.add_modifier(Modifier::BOLD);
            }
            if st.font_style.contains(FontStyle::ITALIC) {
                style = style.add_modifier(Modifier::ITALIC);
            }
            if st.font_style.contains(FontStyle::UNDERLINE) {
                style = style.add_modifier(Modifier::UNDERLINED);
            }
            frags.push((clean(s), style));
        }
        out.push(frags);
    }
    Some(out)
}

/// Something that contributes a prefix to every line inside it.
enum Container {
    /// Block quotes and the thinking gutter: glyphs, style, width.
    Bar(&'static str, Style, usize),
    /// A list item: the marker on its first line, as many spaces after (hanging indent).
    Item {
        marker: String,
        used: bool,
        width: usize,
    },
}

impl Container {
    fn bar(glyphs: &'static str, style: Style) -> Container {
        Container::Bar(glyphs, style, width_of(glyphs))
    }

    fn width(&self) -> usize {
        match self {
            Container::Bar(_, _, w) | Container::Item { width: w, .. } => *w,
        }
    }
}

#[derive(Default)]
struct Table {
    aligns: Vec<Alignment>,
    head: Option<Vec<Vec<Piece>>>,
    rows: Vec<Vec<Vec<Piece>>>,
    row: Vec<Vec<Piece>>,
}

/// The renderer's working state for one document (lives for one call).
struct Md<'t> {
    width: usize,
    theme: &'t Theme,
    base: Style,
    out: Vec<Line<'static>>,
    bars: Vec<Container>,
    inline: Vec<Piece>,
    styles: Vec<Style>,
    /// Open links and images: destination and where their text starts in `inline`.
    links: Vec<(String, usize)>,
    /// Open lists: the next number of an ordered one.
    lists: Vec<Option<u64>>,
    pending_blank: bool,
    code: Option<(Option<String>, String)>,
    table: Option<Table>,
    in_html: bool,
    /// Number code blocks in their header (the answer's, matching [`code_blocks`]).
    number_code: bool,
    code_count: usize,
}

impl<'t> Md<'t> {
    fn new(width: usize, theme: &'t Theme, base: Style, number_code: bool) -> Md<'t> {
        Md {
            width,
            theme,
            base,
            out: Vec::new(),
            bars: Vec::new(),
            inline: Vec::new(),
            styles: Vec::new(),
            links: Vec::new(),
            lists: Vec::new(),
            pending_blank: false,
            code: None,
            table: None,
            in_html: false,
            number_code,
            code_count: 0,
        }
    }

    fn run(&mut self, text: &str) {
        for (ev, at) in Parser::new_ext(text, options()).into_offset_iter() {
            match ev {
                Event::Start(tag) => self.start(tag),
                Event::End(end) => self.end(end),
                Event::Text(t) => {
                    if let Some((_, code)) = &mut self.code {
                        code.push_str(&t);
                    } else if self.in_html {
                        self.html(&t);
                    } else {
                        self.piece(&t, self.style());
                    }
                }
                Event::Code(t) => {
                    let style = self.style().patch(self.code_style());
                    self.piece(&t, style);
                }
                Event::InlineMath(t) | Event::DisplayMath(t) => self.piece(&t, self.style()),
                Event::Html(t) | Event::InlineHtml(t) => {
                    if self.in_html {
                        self.html(&t);
                    } else {
                        self.piece(&t, self.style().patch(self.theme.dim));
                    }
                }
                Event::FootnoteReference(t) => self.piece(&format!("[^{t}]"), self.style()),
                // A reply's single newlines are meant (a poem, steps without markers,
                // code without a fence): kept as breaks, as chat UIs and GitHub comments
                // do, where CommonMark joins the lines. Outside lists and quotes the next
                // line's indentation, which the parser strips, is kept too.
                Event::SoftBreak => {
                    self.inline.push(Piece::Break);
                    if self.bars.is_empty() && self.table.is_none() {
                        // `piece` shows a tab as four spaces, as everywhere.
                        let rest = text.get(at.end..).unwrap_or("");
                        let indent =
                            &rest[..rest.len() - rest.trim_start_matches([' ', '\t']).len()];
                        if !indent.is_empty() {
                            self.piece(indent, self.style());
                        }
                    }
                }
                Event::HardBreak => self.inline.push(Piece::Break),
                Event::Rule => {
                    self.start_block();
                    let rule = "─".repeat(self.avail());
                    self.emit(vec![vec![Span::styled(rule, self.theme.dim)]]);
                    self.pending_blank = true;
                }
                Event::TaskListMarker(done) => {
                    let mark = if done { "[x] " } else { "[ ] " };
                    self.piece(mark, self.style().patch(self.theme.accent));
                }
            }
        }
        // The parser closes what the text left open; this is only a guard.
        if let Some((lang, code)) = self.code.take() {
            self.code_block(lang, &code);
        }
        self.flush();
    }

    fn style(&self) -> Style {
        self.styles.last().copied().unwrap_or(self.base)
    }

    fn push_style(&mut self, s: Style) {
        self.styles.push(self.style().patch(s));
    }

    fn code_style(&self) -> Style {
        if self.theme.color {
            Style::default().fg(Color::LightYellow)
        } else {
            self.theme.accent
        }
    }

    fn piece(&mut self, s: &str, style: Style) {
        self.inline.push(Piece::Text(clean(s), style));
    }

    /// Raw HTML block text: shown as written, line by line, dimmed.
    fn html(&mut self, s: &str) {
        let style = self.style().patch(self.theme.dim);
        for (i, part) in s.trim_end_matches('\n').split('\n').enumerate() {
            if i > 0 {
                self.inline.push(Piece::Break);
            }
            self.piece(part, style);
        }
        if s.ends_with('\n') {
            self.inline.push(Piece::Break);
        }
    }

    fn start(&mut self, tag: Tag) {
        match tag {
            Tag::Paragraph | Tag::DefinitionListTitle | Tag::DefinitionListDefinition => {
                self.start_block()
            }
            Tag::Heading { level, .. } => {
                self.start_block();
                let n = level as usize;
                let style = if level <= HeadingLevel::H2 {
                    self.theme.title
                } else {
                    self.theme.title.remove_modifier(Modifier::UNDERLINED)
                };
                self.push_style(style.add_modifier(Modifier::BOLD));
                let marker = format!("{} ", "#".repeat(n));
                self.piece(&marker, self.style().patch(self.theme.dim));
            }
            Tag::BlockQuote(_) => {
                self.start_block();
                self.bars.push(Container::bar("│ ", self.theme.dim));
            }
            Tag::CodeBlock(kind) => {
                self.start_block();
                self.code = Some((fence_lang(&kind), String::new()));
            }
            Tag::HtmlBlock => {
                self.start_block();
                self.in_html = true;
            }
            Tag::List(start) => {
                self.start_block();
                self.lists.push(start);
            }
            Tag::Item => {
                self.flush();
                let depth = self.lists.len().saturating_sub(1);
                let marker = match self.lists.last_mut() {
                    Some(Some(n)) => {
                        let m = format!("{n}. ");
                        *n = n.saturating_add(1);
                        m
                    }
                    _ => BULLETS[depth % BULLETS.len()].to_string(),
                };
                self.bars.push(Container::Item {
                    width: width_of(&marker),
                    marker,
                    used: false,
                });
            }
            Tag::Table(aligns) => {
                self.start_block();
                self.table = Some(Table {
                    aligns,
                    ..Table::default()
                });
            }
            Tag::TableHead | Tag::TableRow | Tag::TableCell => {}
            Tag::Emphasis => self.push_style(Style::default().add_modifier(Modifier::ITALIC)),
            Tag::Strong => self.push_style(Style::default().add_modifier(Modifier::BOLD)),
            Tag::Strikethrough => {
                self.push_style(Style::default().add_modifier(Modifier::CROSSED_OUT))
            }
            Tag::Superscript | Tag::Subscript => self.push_style(Style::default()),
            Tag::Link { dest_url, .. } => {
                let style = if self.theme.color {
                    self.theme.accent.add_modifier(Modifier::UNDERLINED)
                } else {
                    Style::default().add_modifier(Modifier::UNDERLINED)
                };
                self.push_style(style);
                self.links.push((dest_url.to_string(), self.inline.len()));
            }
            Tag::Image { dest_url, .. } => {
                self.piece("[image: ", self.style().patch(self.theme.dim));
                self.push_style(Style::default().add_modifier(Modifier::ITALIC));
                self.links.push((dest_url.to_string(), self.inline.len()));
            }
            Tag::FootnoteDefinition(label) => {
                self.start_block();
                self.piece(&format!("[^{label}]: "), self.style().patch(self.theme.dim));
            }
            Tag::DefinitionList | Tag::MetadataBlock(_) => self.start_block(),
        }
    }

    fn end(&mut self, end: TagEnd) {
        match end {
            TagEnd::Paragraph
            | TagEnd::DefinitionListTitle
            | TagEnd::DefinitionListDefinition
            | TagEnd::FootnoteDefinition
            | TagEnd::DefinitionList
            | TagEnd::MetadataBlock(_) => {
                self.flush();
                self.pending_blank = true;
            }
            TagEnd::Heading(_) => {
                self.flush();
                self.styles.pop();
                self.pending_blank = true;
            }
            TagEnd::BlockQuote(_) => {
                self.flush();
                self.bars.pop();
                self.pending_blank = true;
            }
            TagEnd::CodeBlock => {
                if let Some((lang, code)) = self.code.take() {
                    self.code_block(lang, &code);
                }
                self.pending_blank = true;
            }
            TagEnd::HtmlBlock => {
                self.flush();
                self.in_html = false;
                self.pending_blank = true;
            }
            TagEnd::List(_) => {
                self.flush();
                self.lists.pop();
                if self.lists.is_empty() {
                    self.pending_blank = true;
                }
            }
            TagEnd::Item => {
                self.flush();
                if let Some(Container::Item { used: false, .. }) = self.bars.last() {
                    // An empty item still shows its marker.
                    let line = self.prefix(true);
                    self.out.push(trim_end(line));
                }
                self.bars.pop();
            }
            TagEnd::TableCell => {
                let cell = std::mem::take(&mut self.inline);
                if let Some(t) = &mut self.table {
                    t.row.push(cell);
                }
            }
            TagEnd::TableHead => {
                if let Some(t) = &mut self.table {
                    t.head = Some(std::mem::take(&mut t.row));
                }
            }
            TagEnd::TableRow => {
                if let Some(t) = &mut self.table {
                    let row = std::mem::take(&mut t.row);
                    t.rows.push(row);
                }
            }
            TagEnd::Table => {
                self.inline.clear();
                if let Some(t) = self.table.take() {
                    self.render_table(t);
                }
                self.pending_blank = true;
            }
            TagEnd::Emphasis
            | TagEnd::Strong
            | TagEnd::Strikethrough
            | TagEnd::Superscript
            | TagEnd::Subscript => {
                self.styles.pop();
            }
            TagEnd::Link => {
                self.styles.pop();
                if let Some((url, start)) = self.links.pop() {
                    let text: String = self
                        .inline
                        .get(start..)
                        .unwrap_or_default()
                        .iter()
                        .filter_map(|p| match p {
                            Piece::Text(s, _) => Some(s.as_str()),
                            Piece::Break => None,
                        })
                        .collect();
                    // Autolinks show their address already.
                    let shown = url.is_empty()
                        || text == clean(&url)
                        || url.strip_prefix("mailto:") == Some(text.as_str());
                    if !shown {
                        self.piece(&format!(" ({url})"), self.base.patch(self.theme.dim));
                    }
                }
            }
            TagEnd::Image => {
                self.styles.pop();
                let url = self.links.pop().map(|(u, _)| u).unwrap_or_default();
                let dim = self.base.patch(self.theme.dim);
                self.piece("]", dim);
                if !url.is_empty() {
                    self.piece(&format!(" ({url})"), dim);
                }
            }
        }
    }

    /// The prefix of the next line: bars and list markers (a marker only once, when
    /// `consume`; spaces after). Cut so at least one column is left for content; markers
    /// cut off still count as shown.
    fn prefix(&mut self, consume: bool) -> Vec<Span<'static>> {
        let max = self.width.saturating_sub(1);
        let mut used = 0;
        let mut full = false;
        let mut spans = Vec::new();
        for c in &mut self.bars {
            let w = c.width();
            full = full || used + w > max;
            let show = match c {
                Container::Bar(..) => None,
                Container::Item { used: u, .. } => {
                    let first = consume && !*u;
                    *u |= consume;
                    Some(first)
                }
            };
            if full {
                continue;
            }
            used += w;
            spans.push(match (c, show) {
                (Container::Bar(g, st, _), _) => Span::styled(*g, *st),
                (Container::Item { marker, .. }, Some(true)) => {
                    Span::styled(marker.clone(), self.theme.accent)
                }
                _ => Span::raw(" ".repeat(w)),
            });
        }
        spans
    }

    fn prefix_width(&self) -> usize {
        let max = self.width.saturating_sub(1);
        let mut used = 0;
        for c in &self.bars {
            if used + c.width() > max {
                break;
            }
            used += c.width();
        }
        used
    }

    /// Columns left for content inside the containers.
    fn avail(&self) -> usize {
        self.width.saturating_sub(self.prefix_width()).max(1)
    }

    fn emit(&mut self, lines: Vec<Vec<Span<'static>>>) {
        for content in lines {
            let mut spans = self.prefix(true);
            spans.extend(content);
            self.out.push(Line::from(spans));
        }
    }

    /// Wraps and emits the inline content gathered so far.
    fn flush(&mut self) {
        if self.inline.is_empty() {
            return;
        }
        let pieces = std::mem::take(&mut self.inline);
        let lines = wrap(&pieces, self.avail());
        self.emit(lines);
    }

    /// Before a block: what came before is emitted, and a blank line separates blocks.
    fn start_block(&mut self) {
        self.flush();
        if self.pending_blank && !self.out.is_empty() {
            let line = self.prefix(false);
            self.out.push(trim_end(line));
        }
        self.pending_blank = false;
    }

    fn code_block(&mut self, lang: Option<String>, code: &str) {
        let avail = self.avail();
        let dim = self.theme.dim;
        let mut label = lang.as_deref().map(clean).unwrap_or_else(|| "code".into());
        if self.number_code {
            self.code_count += 1;
            label.push_str(&format!(" #{}", self.code_count));
        }
        let head = format!("┌─ {label} ");
        let fill = avail.saturating_sub(width_of(&head));
        let mut lines = vec![vec![Span::styled(
            format!("{head}{}", "─".repeat(fill)),
            dim,
        )]];

        let highlighted = match &lang {
            Some(l) if self.theme.color => highlight(l, code),
            _ => None,
        };
        let source: Vec<Frags> = highlighted
            .unwrap_or_else(|| code.lines().map(|l| vec![(clean(l), self.base)]).collect());
        // No word wrap in code: lines are cut hard, continuations marked in the gutter.
        let gutter = avail >= 4;
        let inner = if gutter { avail - 2 } else { avail };
        for frags in source {
            let mut chunks: Vec<Frags> = vec![Vec::new()];
            let mut w = 0;
            for (s, st) in &frags {
                for g in s.graphemes(true) {
                    let gw = UnicodeWidthStr::width(g);
                    let (g, gw) = if gw > inner { ("…", 1) } else { (g, gw) };
                    if w + gw > inner {
                        chunks.push(Vec::new());
                        w = 0;
                    }
                    push_frag(chunks.last_mut().expect("one chunk"), g, *st);
                    w += gw;
                }
            }
            for (i, chunk) in chunks.into_iter().enumerate() {
                let mut spans = Vec::new();
                if gutter {
                    spans.push(Span::styled(if i == 0 { "│ " } else { "┆ " }, dim));
                }
                spans.extend(chunk.into_iter().map(|(s, st)| Span::styled(s, st)));
                lines.push(spans);
            }
        }
        lines.push(vec![Span::styled(
            format!("└{}", "─".repeat(avail.saturating_sub(1))),
            dim,
        )]);
        self.emit(lines);
    }

    fn render_table(&mut self, t: Table) {
        const SEP: &str = " │ ";
        let avail = self.avail();
        let mut rows: Vec<(bool, Vec<Vec<Piece>>)> = Vec::new();
        if let Some(h) = t.head {
            rows.push((true, h));
        }
        rows.extend(t.rows.into_iter().map(|r| (false, r)));
        let ncols = rows
            .iter()
            .map(|(_, r)| r.len())
            .max()
            .unwrap_or(0)
            .max(t.aligns.len());
        if ncols == 0 {
            return;
        }
        let mut natural = vec![1usize; ncols];
        for (_, row) in &rows {
            for (j, cell) in row.iter().enumerate() {
                natural[j] = natural[j].max(cell_width(cell));
            }
        }
        let widths = fit_columns(&natural, avail.saturating_sub(3 * (ncols - 1)));
        let sep_style = self.theme.dim;
        let mut lines = Vec::new();
        for (head, row) in rows {
            let cells: Vec<Vec<Vec<Span<'static>>>> = (0..ncols)
                .map(|j| {
                    let cell = row.get(j).map(Vec::as_slice).unwrap_or_default();
                    if head {
                        let bold: Vec<Piece> = cell
                            .iter()
                            .map(|p| match p {
                                Piece::Text(s, st) => {
                                    Piece::Text(s.clone(), st.add_modifier(Modifier::BOLD))
                                }
                                Piece::Break => Piece::Break,
                            })
                            .collect();
                        wrap(&bold, widths[j])
                    } else {
                        wrap(cell, widths[j])
                    }
                })
                .collect();
            let height = cells.iter().map(Vec::len).max().unwrap_or(0).max(1);
            for k in 0..height {
                let mut spans = Vec::new();
                for (j, cell) in cells.iter().enumerate() {
                    if j > 0 {
                        spans.push(Span::styled(SEP, sep_style));
                    }
                    let content = cell.get(k).cloned().unwrap_or_default();
                    let cw: usize = content.iter().map(|s| width_of(&s.content)).sum();
                    let pad = widths[j].saturating_sub(cw);
                    let (left, right) = match t.aligns.get(j) {
                        Some(Alignment::Right) => (pad, 0),
                        Some(Alignment::Center) => (pad / 2, pad - pad / 2),
                        _ => (0, pad),
                    };
                    if left > 0 {
                        spans.push(Span::raw(" ".repeat(left)));
                    }
                    spans.extend(content);
                    if right > 0 && j + 1 < ncols {
                        spans.push(Span::raw(" ".repeat(right)));
                    }
                }
                lines.push(spans);
            }
            if head {
                let rule: Vec<String> = widths.iter().map(|&w| "─".repeat(w)).collect();
                lines.push(vec![Span::styled(rule.join("─┼─"), sep_style)]);
            }
        }
        self.emit(lines);
    }
}

/// A cell's width on one line (hard breaks start new lines).
fn cell_width(cell: &[Piece]) -> usize {
    let (mut max, mut cur) = (0, 0);
    for p in cell {
        match p {
            Piece::Text(s, _) => cur += width_of(s),
            Piece::Break => {
                max = usize::max(max, cur);
                cur = 0;
            }
        }
    }
    max.max(cur)
}

/// Column widths: natural when they fit in `target`, else the widest columns are cut to
/// a common cap (found by bisection, so huge tables stay cheap) and what is left over goes
/// to the cut ones. Never below one column each.
fn fit_columns(natural: &[usize], target: usize) -> Vec<usize> {
    if natural.iter().sum::<usize>() <= target {
        return natural.to_vec();
    }
    if target <= natural.len() {
        return vec![1; natural.len()];
    }
    let total = |cap: usize| natural.iter().map(|&w| w.min(cap)).sum::<usize>();
    let (mut lo, mut hi) = (1, natural.iter().copied().max().unwrap_or(1));
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if total(mid) <= target {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    let mut widths: Vec<usize> = natural.iter().map(|&w| w.min(lo)).collect();
    let mut left = target - total(lo);
    for (w, &n) in widths.iter_mut().zip(natural) {
        if left == 0 {
            break;
        }
        if n > *w {
            *w += 1;
            left -= 1;
        }
    }
    widths
}

/// A line without trailing blanks (blank separator lines inside quotes keep their bar).
fn trim_end(mut spans: Vec<Span<'static>>) -> Line<'static> {
    while let Some(last) = spans.last_mut() {
        let t = last.content.trim_end();
        if t.is_empty() {
            spans.pop();
        } else {
            if t.len() != last.content.len() {
                last.content = Cow::Owned(t.to_string());
            }
            break;
        }
    }
    Line::from(spans)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn text(lines: &[Line]) -> String {
        lines
            .iter()
            .map(|l| {
                let s: String = l.spans.iter().map(|s| s.content.as_ref()).collect();
                s.trim_end().to_string()
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn plain(md: &str, width: u16) -> String {
        text(&render(md, width, &Theme::plain(), &MdOptions::default()))
    }

    fn check_widths(md: &str, width: u16, theme: &Theme) {
        for expand in [false, true] {
            let opts = MdOptions {
                expand_thinking: expand,
                thinking_open: false,
                toggle_key: "t",
            };
            for l in render(md, width, theme, &opts) {
                assert!(
                    l.width() <= width as usize,
                    "line {:?} is {} wide, more than {width}",
                    l,
                    l.width()
                );
                for s in &l.spans {
                    assert!(
                        !s.content.chars().any(char::is_control),
                        "control character in {:?}",
                        s.content
                    );
                }
            }
        }
    }

    #[test]
    fn paragraphs_wrap_at_words() {
        let out = plain("The quick brown fox jumps over the lazy dog.", 16);
        assert_eq!(out, "The quick brown\nfox jumps over\nthe lazy dog.");
    }

    #[test]
    fn long_words_break_hard() {
        let out = plain(
            "see https://example.com/a/very/long/path/that/never/ends ok",
            20,
        );
        for l in out.lines() {
            assert!(width_of(l) <= 20, "{l:?}");
        }
        assert!(out.starts_with("see https://"));
        assert!(out.ends_with(" ok"));
    }

    #[test]
    fn wide_characters_count_two_columns() {
        let out = plain("漢字漢字漢字漢字漢字", 7);
        assert_eq!(out, "漢字漢\n字漢字\n漢字漢\n字");
        // A column too narrow for one wide character shows an ellipsis, not an overflow.
        assert_eq!(plain("漢", 1), "…");
    }

    #[test]
    fn list_items_hang_on_wrap() {
        let out = plain(
            "- one two three four five six\n  - nested item that wraps too",
            14,
        );
        assert_eq!(
            out,
            "• one two\n  three four\n  five six\n  ◦ nested\n    item that\n    wraps too"
        );
    }

    #[test]
    fn numbered_lists_start_where_told() {
        let out = plain("3. three\n4. four", 20);
        assert_eq!(out, "3. three\n4. four");
    }

    #[test]
    fn links_show_their_address_dimmed() {
        let out = plain("[docs](https://docs.rs) and <https://x.y>", 60);
        assert_eq!(out, "docs (https://docs.rs) and https://x.y");
    }

    #[test]
    fn control_characters_are_escaped() {
        let lines = render(
            "evil \u{1b}[31mred\u{7} `\u{1b}]0;title` \u{202e}abc",
            80,
            &Theme::plain(),
            &MdOptions::default(),
        );
        let t = text(&lines);
        assert!(!t.chars().any(|c| c.is_control() || c == '\u{202e}'));
        assert!(t.contains("\\u{1b}[31mred\\u{7}"), "{t}");
        let code = render(
            "```\na\u{1b}b\tc\n```",
            80,
            &Theme::dark(),
            &MdOptions::default(),
        );
        assert!(text(&code).contains("a\\u{1b}b    c"));
    }

    #[test]
    fn code_blocks_are_found_in_order() {
        let md = "<think>\n```py\ndraft()\n```\n</think>\nText\n\n```rust,ignore\nfn a() {}\n```\n\n    indented\n\n```\nopen fence";
        let blocks = code_blocks(md);
        assert_eq!(
            blocks,
            vec![
                CodeBlock {
                    lang: Some("rust".into()),
                    code: "fn a() {}\n".into()
                },
                CodeBlock {
                    lang: None,
                    code: "indented\n".into()
                },
                CodeBlock {
                    lang: None,
                    code: "open fence".into()
                },
            ]
        );
        assert!(code_blocks("no code here").is_empty());
        let (thought, answer) = split_thinking("<think>hm</think>yes", false);
        assert_eq!((thought, answer), (Some("hm"), "yes"));
        let (thought, answer) = split_thinking("hm</think>yes", true);
        assert_eq!((thought, answer), (Some("hm"), "yes"));
        assert_eq!(code_blocks("```sh\nls\n```").len(), 1);
    }

    #[test]
    fn code_is_highlighted_in_colour_only() {
        let md = "```rust\nfn main() { let x = 1; }\n```";
        let dark = render(md, 40, &Theme::dark(), &MdOptions::default());
        let coloured = dark[1]
            .spans
            .iter()
            .filter(|s| s.style.fg.is_some())
            .count();
        assert!(coloured >= 3, "{:?}", dark[1]);
        let plain = render(md, 40, &Theme::plain(), &MdOptions::default());
        assert!(plain
            .iter()
            .flat_map(|l| &l.spans)
            .all(|s| s.style.fg.is_none() && s.style.bg.is_none()));
        assert_eq!(text(&dark), text(&plain));
    }

    #[test]
    fn code_lines_are_cut_not_wrapped_at_words() {
        let out = plain("```\nabcdefghij klmnop\n```", 10);
        assert_eq!(out, "┌─ code #1\n│ abcdefgh\n┆ ij klmno\n┆ p\n└─────────");
    }

    #[test]
    fn tables_shrink_to_fit() {
        let md = "| name | description |\n|---|--:|\n| a | a rather long description that must wrap |\n| bb | short |";
        let wide = plain(md, 80);
        assert_eq!(
            wide,
            "name │                              description\n\
             ─────┼─────────────────────────────────────────\n\
             a    │ a rather long description that must wrap\n\
             bb   │                                    short"
        );
        let narrow = plain(md, 24);
        for l in narrow.lines() {
            assert!(width_of(l) <= 24, "{l:?}");
        }
        assert!(narrow.lines().count() > 4);
        assert_eq!(fit_columns(&[10, 50, 3], 30), vec![10, 17, 3]);
        assert_eq!(fit_columns(&[5, 5], 1), vec![1, 1]);
    }

    #[test]
    fn thinking_folds_and_counts_words() {
        let opts = MdOptions {
            toggle_key: "t",
            ..MdOptions::default()
        };
        let out = render(
            "<think>one two three</think>\n\nAnswer.",
            60,
            &Theme::plain(),
            &opts,
        );
        assert_eq!(
            text(&out),
            "▸ thinking (3 words) — press t to expand\n\nAnswer."
        );
        let streaming = render("<think>one", 60, &Theme::plain(), &MdOptions::default());
        assert_eq!(text(&streaming), "▸ thinking… (1 word)");
        let open = MdOptions {
            thinking_open: true,
            expand_thinking: true,
            ..MdOptions::default()
        };
        let out = render("hmm</think>Yes", 60, &Theme::plain(), &open);
        assert_eq!(text(&out), "▾ thinking (1 word)\n┊ hmm\n\nYes");
    }

    #[test]
    fn hostile_inputs_render_quickly() {
        let theme = Theme::dark();
        let long_word = "x".repeat(100_000);
        let long_line = "word ".repeat(20_000);
        let deep_quote = format!("{} deep", ">".repeat(5_000));
        let deep_list = (0..2_000)
            .map(|i| format!("{}- item", "  ".repeat(i)))
            .collect::<Vec<_>>()
            .join("\n");
        let wide_table = format!(
            "|{}\n|{}\n|{}",
            "h|".repeat(500),
            "-|".repeat(500),
            "cell text|".repeat(500)
        );
        let long_table = format!("|a|b|\n|-|-|\n{}", "|1|2|\n".repeat(5_000));
        let code = format!("```rust\n{}\n", "let x = 1; ".repeat(20_000));
        let start = std::time::Instant::now();
        for md in [
            &long_word,
            &long_line,
            &deep_quote,
            &deep_list,
            &wide_table,
            &long_table,
            &code,
        ] {
            for w in [1, 7, 80] {
                check_widths(md, w, &theme);
            }
        }
        assert!(start.elapsed().as_secs() < 60, "took {:?}", start.elapsed());
    }

    #[test]
    fn zero_width_renders_nothing() {
        assert!(render("# hi", 0, &Theme::plain(), &MdOptions::default()).is_empty());
        assert!(render_plain("hi", 0, Style::default()).is_empty());
    }

    #[test]
    fn single_newlines_stay_line_breaks() {
        // Code without a fence keeps its lines and their indentation; inside a list the
        // continuation's indentation is the list's, not added again.
        let out = plain("def f(x):\n    return x\nend\n\n- a\n  b", 40);
        assert_eq!(out, "def f(x):\n    return x\nend\n\n• a\n  b");
        // Long lines still wrap; a tab indents four columns.
        let out = plain("one two three\n\tfour", 8);
        assert_eq!(out, "one two\nthree\n    four");
    }

    #[test]
    fn plain_text_keeps_indentation() {
        let out = text(&render_plain("a\n    b *c*\n\n", 20, Style::default()));
        assert_eq!(out, "a\n    b *c*");
    }

    /// Markdown-ish garbage: fragments that open and close constructs at random.
    fn garbage() -> impl Strategy<Value = String> {
        let atoms = prop_oneof![
            Just("# ".to_string()),
            Just("\n".to_string()),
            Just("\n\n".to_string()),
            Just("- ".to_string()),
            Just("1. ".to_string()),
            Just("> ".to_string()),
            Just("```rust\n".to_string()),
            Just("```".to_string()),
            Just("|".to_string()),
            Just("|---|".to_string()),
            Just("**".to_string()),
            Just("*".to_string()),
            Just("~~".to_string()),
            Just("`".to_string()),
            Just("[a](http://b)".to_string()),
            Just("<think>".to_string()),
            Just("</think>".to_string()),
            Just("    ".to_string()),
            Just("\t".to_string()),
            Just("漢字".to_string()),
            Just("e\u{301}".to_string()),
            Just("👩‍👩‍👧".to_string()),
            Just("❤\u{fe0f}".to_string()),
            Just("\u{1b}[2J".to_string()),
            Just("---\n".to_string()),
            Just("- [x] ".to_string()),
            "[a-z ]{0,30}",
            any::<String>(),
        ];
        prop::collection::vec(atoms, 0..40).prop_map(|v| v.concat())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn any_input_fits_the_width(md in garbage(), width in 1u16..120) {
            check_widths(&md, width, &Theme::plain());
            check_widths(&md, width, &Theme::dark());
            let _ = code_blocks(&md);
            for l in render_plain(&md, width, Style::default()) {
                prop_assert!(l.width() <= width as usize);
            }
        }
    }
}
