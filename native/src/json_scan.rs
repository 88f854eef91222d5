//! A quick scan of a JSON payload for what serde_json's path would answer: a publish's
//! SOW key (staging.rs's `key_of`) and whether an unkeyed payload is JSON (frames.rs's
//! `valid`).
//!
//! Reading a tcp:// publish's key through serde_json cost the gateway's loop about 3,000
//! instructions for a 200-byte document (a visitor call per value, every number parsed
//! to a float), a fifth of all it spent on the publish (docs/performance.md). This scan
//! checks the same grammar a byte at a time (strings eight bytes at a time) and parses
//! nothing but the key. It answers only where it is sure of what the serde path gives:
//! anything else — an escape in a member name or in the key, a lone surrogate's escape,
//! a number near f64's limits, the key field twice, nesting past MAX_DEPTH, bytes that
//! are not JSON — is None here, and the serde path decides as before. So the answers are
//! the serde path's by construction where this gives one; tests/native/test_frames.py
//! and test_staging.py hold both to the Python twins' (orjson) answers.
use std::borrow::Cow;

use crate::staging::Key;

/// Deepest nesting answered here (serde_json stops at 128).
const MAX_DEPTH: usize = 100;
/// A number whose integer digits plus its exponent pass this is left to the serde path:
/// below it the value is under 1e300, short of staging.rs's LARGEST_SURE_FLOAT and
/// f64's range.
const MAX_MAGNITUDE: i64 = 300;
/// A key of more digits may not fit 64 bits: left to the serde path.
const MAX_KEY_DIGITS: usize = 19;

const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The high bit of each of a word's 8 bytes that needs a look in a string — a quote, a
/// backslash, a control character, a byte of a multi-byte UTF-8 sequence — exact for
/// the lowest such byte (a borrow may mark bytes above it).
fn special(word: u64) -> u64 {
    let zero = |x: u64| x.wrapping_sub(ONES) & !x & HIGHS;
    let control = word.wrapping_sub(ONES * 0x20) & !word & HIGHS;
    (zero(word ^ (ONES * b'"' as u64)) | zero(word ^ (ONES * b'\\' as u64)) | control | word)
        & HIGHS
}

/// A number: its integer digits (after any minus), or None for a float.
struct Number<'p> {
    negative: bool,
    integer: Option<&'p [u8]>,
}

struct Scanner<'p> {
    bytes: &'p [u8],
    at: usize,
    /// A byte past ASCII was seen (in a string): the payload's UTF-8 is checked at the end.
    wide: bool,
}

impl<'p> Scanner<'p> {
    fn new(bytes: &'p [u8]) -> Self {
        Self {
            bytes,
            at: 0,
            wide: false,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    fn skip_space(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.at += 1;
        }
    }

    fn expect(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.at += 1)
    }

    /// Whether the scan ended at the payload's end with every byte sure.
    fn finished(&mut self) -> bool {
        self.skip_space();
        self.at == self.bytes.len() && (!self.wide || std::str::from_utf8(self.bytes).is_ok())
    }

    /// A string's contents, the opening quote consumed, and whether it holds escapes.
    fn string(&mut self) -> Option<(&'p [u8], bool)> {
        let (start, mut escaped) = (self.at, false);
        loop {
            // eight bytes at a time to the first that needs a look, else byte by byte
            while let Some(word) = self.bytes.get(self.at..self.at + 8) {
                let found = special(u64::from_le_bytes(word.try_into().ok()?));
                if found != 0 {
                    self.at += (found.trailing_zeros() / 8) as usize;
                    break;
                }
                self.at += 8;
            }
            let byte = self.peek()?;
            self.at += 1;
            match byte {
                b'"' => return Some((&self.bytes[start..self.at - 1], escaped)),
                b'\\' => {
                    self.escape()?;
                    escaped = true;
                }
                0..=0x1f => return None,
                0x80.. => self.wide = true,
                _ => {} // within the last eight bytes
            }
        }
    }

    /// An escape, its backslash consumed: what serde_json and orjson both take, but a
    /// `\u` of a surrogate (whether it pairs is the serde path's to judge).
    fn escape(&mut self) -> Option<()> {
        let byte = self.peek()?;
        self.at += 1;
        match byte {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(()),
            b'u' => {
                let hex = std::str::from_utf8(self.bytes.get(self.at..self.at + 4)?).ok()?;
                if !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return None;
                }
                self.at += 4;
                let unit = u16::from_str_radix(hex, 16).ok()?;
                (!(0xD800..=0xDFFF).contains(&unit)).then_some(())
            }
            _ => None,
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.at;
        while let Some(b'0'..=b'9') = self.peek() {
            self.at += 1;
        }
        self.at - start
    }

    /// A number within MAX_MAGNITUDE, as JSON writes it.
    fn number(&mut self) -> Option<Number<'p>> {
        let negative = self.peek()? == b'-';
        self.at += negative as usize;
        let start = self.at;
        let whole = match self.peek()? {
            b'0' => {
                self.at += 1;
                1
            }
            b'1'..=b'9' => self.digits(),
            _ => return None,
        };
        let digits = &self.bytes[start..self.at];
        let mut float = false;
        if self.peek() == Some(b'.') {
            self.at += 1;
            (self.digits() > 0).then_some(())?;
            float = true;
        }
        let mut exponent = 0;
        if let Some(b'e' | b'E') = self.peek() {
            self.at += 1;
            let sign = match self.peek()? {
                b'-' => -1,
                b'+' => 1,
                _ => 0,
            };
            self.at += (sign != 0) as usize;
            let start = self.at;
            if !(1..=2).contains(&self.digits()) {
                return None; // no digits, or an exponent serde_json may take as out of range
            }
            let text = std::str::from_utf8(&self.bytes[start..self.at]).ok()?;
            exponent = text.parse::<i64>().ok()? * if sign < 0 { -1 } else { 1 };
            float = true;
        }
        (whole as i64 + exponent.max(0) <= MAX_MAGNITUDE).then_some(())?;
        Some(Number {
            negative,
            integer: (!float).then_some(digits),
        })
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        (self.bytes.get(self.at..self.at + word.len())? == word).then(|| self.at += word.len())
    }

    /// Any value, checked and dropped.
    fn value(&mut self, depth: usize) -> Option<()> {
        match self.peek()? {
            b'{' => self.members(depth + 1, |scanner, _, _| scanner.value(depth + 1)),
            b'[' => self.elements(depth + 1),
            b'"' => {
                self.at += 1;
                self.string().map(drop)
            }
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b'-' | b'0'..=b'9' => self.number().map(drop),
            _ => None,
        }
    }

    /// An object's members, at its `{`: `member(scanner, name, escaped)` reads each value.
    fn members(
        &mut self,
        depth: usize,
        mut member: impl FnMut(&mut Self, &'p [u8], bool) -> Option<()>,
    ) -> Option<()> {
        (depth <= MAX_DEPTH).then_some(())?;
        self.at += 1;
        self.skip_space();
        if self.peek()? == b'}' {
            self.at += 1;
            return Some(());
        }
        loop {
            self.expect(b'"')?;
            let (name, escaped) = self.string()?;
            self.skip_space();
            self.expect(b':')?;
            self.skip_space();
            member(self, name, escaped)?;
            self.skip_space();
            match self.peek()? {
                b',' => {
                    self.at += 1;
                    self.skip_space();
                }
                b'}' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// An array's elements, at its `[`.
    fn elements(&mut self, depth: usize) -> Option<()> {
        (depth <= MAX_DEPTH).then_some(())?;
        self.at += 1;
        self.skip_space();
        if self.peek()? == b']' {
            self.at += 1;
            return Some(());
        }
        loop {
            self.value(depth)?;
            self.skip_space();
            match self.peek()? {
                b',' => {
                    self.at += 1;
                    self.skip_space();
                }
                b']' => {
                    self.at += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// The key field's value: non-empty text without escapes, or a whole number >= 0
    /// that surely fits 64 bits.
    fn key(&mut self) -> Option<Key<'p>> {
        if self.peek()? == b'"' {
            self.at += 1;
            let (text, escaped) = self.string()?;
            if escaped || text.is_empty() {
                return None;
            }
            return Some(Key::Text(Cow::Borrowed(std::str::from_utf8(text).ok()?)));
        }
        let number = self.number()?;
        match number.integer {
            Some(digits) if !number.negative && digits.len() <= MAX_KEY_DIGITS => {
                let text = std::str::from_utf8(digits).ok()?;
                Some(Key::Unsigned(text.parse().ok()?))
            }
            _ => None,
        }
    }
}

/// The SOW key `key_of(payload, field)` gives, when this scan is sure of it; None when
/// the serde path must decide (including every payload it refuses).
pub(crate) fn key<'p>(payload: &'p [u8], field: &str) -> Option<Key<'p>> {
    let mut scanner = Scanner::new(payload);
    scanner.skip_space();
    if scanner.peek()? != b'{' {
        return None;
    }
    let mut found = None;
    scanner.members(1, |scanner, name, escaped| {
        if escaped {
            return None; // its unescaped name may be the field's
        }
        if name != field.as_bytes() {
            return scanner.value(1);
        }
        if found.is_some() {
            return None; // the key field twice: the serde path refuses it
        }
        found = Some(scanner.key()?);
        Some(())
    })?;
    if !scanner.finished() {
        return None;
    }
    found
}

/// Whether the payload is surely JSON as `valid` takes it (false: the serde path decides).
pub(crate) fn valid(payload: &[u8]) -> bool {
    let mut scanner = Scanner::new(payload);
    scanner.skip_space();
    scanner.value(0).is_some() && scanner.finished()
}
