package config

import (
	"bytes"
	"fmt"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
)

// Bounds on a config file, checked before hcl/v2 parses it. Its parser
// recurses once or more for every level of nesting, every unary operator
// and every postfix index or splat, and the decoder recurses once per
// binary operator in a chain: a hostile file a few hundred KiB long, such
// as 100,000 '[' in a row, would exhaust the goroutine stack, which Go
// treats as a fatal error that no recover catches. The bounds sit far
// above anything a hand-written config needs.
const (
	// maxFileBytes bounds a config file's size, and with it the memory
	// that scanning and parsing it take, many times its size.
	maxFileBytes = 256 << 10
	// maxNesting bounds how deep brackets, braces, parentheses, strings,
	// heredocs and template sequences (${ and %{) nest.
	maxNesting = 128
	// maxExprDepth bounds an expression's depth in tokens: along the path
	// from the start of an attribute (or block header) to any token, the
	// tokens that the parser or the decoder may have to nest, counted from
	// the last separator (comma, '=', or the newline that ends an item) at
	// each level.
	maxExprDepth = 1024
)

// checkBounds reports the first place where src exceeds a bound, or nil.
// It runs hcl/v2's own scanner, which is iterative and treats strings,
// heredocs, template sequences and comments exactly as the parser will,
// and walks the tokens with an explicit stack.
func checkBounds(src []byte, filename string) hcl.Diagnostics {
	if len(src) > maxFileBytes {
		start := hcl.Pos{Line: 1, Column: 1}
		return hcl.Diagnostics{{
			Severity: hcl.DiagError,
			Summary:  "Config file too large",
			Detail:   fmt.Sprintf("The file is larger than %d bytes (256 KiB), the most the host reads.", maxFileBytes),
			Subject:  &hcl.Range{Filename: filename, Start: start, End: start},
		}}
	}
	tokens, _ := hclsyntax.LexConfig(src, filename, hcl.InitialPos)

	// stack holds, for each open level, its opening token and the
	// depth counted in its parent's current segment when it opened.
	type level struct {
		open hclsyntax.TokenType
		seg  int
	}
	var stack []level
	base := 0 // the sum of the segments of the open levels
	seg := 0  // tokens in the current segment of the innermost level
	for _, tok := range tokens {
		inTemplate := len(stack) > 0 &&
			(stack[len(stack)-1].open == hclsyntax.TokenOQuote || stack[len(stack)-1].open == hclsyntax.TokenOHeredoc)
		switch tok.Type {
		case hclsyntax.TokenOBrace, hclsyntax.TokenOBrack, hclsyntax.TokenOParen,
			hclsyntax.TokenOQuote, hclsyntax.TokenOHeredoc,
			hclsyntax.TokenTemplateInterp, hclsyntax.TokenTemplateControl:
			// A template parses its ${ sequences one after another, but
			// nests its %{ if and for directives.
			if !inTemplate || tok.Type == hclsyntax.TokenTemplateControl {
				seg++
			}
			if len(stack) == maxNesting {
				return hcl.Diagnostics{{
					Severity: hcl.DiagError,
					Summary:  "Config nested too deeply",
					Detail: fmt.Sprintf("Brackets, braces, parentheses, strings and template sequences nest more than %d deep here; "+
						"the host refuses the file before parsing it.", maxNesting),
					Subject: tok.Range.Ptr(),
				}}
			}
			stack = append(stack, level{open: tok.Type, seg: seg})
			base += seg
			seg = 0
		case hclsyntax.TokenCBrace, hclsyntax.TokenCBrack, hclsyntax.TokenCParen,
			hclsyntax.TokenCQuote, hclsyntax.TokenCHeredoc, hclsyntax.TokenTemplateSeqEnd:
			// An unmatched closer is the parser's to report.
			if len(stack) > 0 {
				top := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				base -= top.seg
				// The closed level counts as the one token that opened
				// it: a chain of indexes or splats still adds up.
				seg = top.seg
			}
		case hclsyntax.TokenComma, hclsyntax.TokenEqual:
			seg = 0
		case hclsyntax.TokenNewline:
			// A newline ends an item in a body or an object; inside
			// brackets and parentheses it is only space.
			if len(stack) == 0 || stack[len(stack)-1].open == hclsyntax.TokenOBrace {
				seg = 0
			}
		case hclsyntax.TokenComment, hclsyntax.TokenEOF, hclsyntax.TokenQuotedLit, hclsyntax.TokenStringLit:
			// Never nested: comments, and the literal text of strings.
		default:
			if !inTemplate {
				seg++
			}
		}
		if base+seg > maxExprDepth {
			return hcl.Diagnostics{{
				Severity: hcl.DiagError,
				Summary:  "Expression too complex",
				Detail: fmt.Sprintf("This expression chains or nests more than %d operators, operands and brackets; "+
					"the host refuses the file before parsing it.", maxExprDepth),
				Subject: tok.Range.Ptr(),
			}}
		}
	}
	return nil
}

// maxQuote bounds how much of a line the diagnostic of a bound quotes.
const maxQuote = 1024

// quoteBounds returns the Files that print d, a diagnostic of checkBounds:
// the source up to the end of the token at fault, so that the snippet
// shows the line up to there and never repeats a hostile line whole; or
// none when that much of the line is longer than maxQuote bytes.
func quoteBounds(src []byte, filename string, d *hcl.Diagnostic) map[string]*hcl.File {
	end := d.Subject.End.Byte
	if end <= 0 || end > len(src) || end-(bytes.LastIndexByte(src[:d.Subject.Start.Byte], '\n')+1) > maxQuote {
		return map[string]*hcl.File{}
	}
	return map[string]*hcl.File{filename: {Bytes: src[:end]}}
}
