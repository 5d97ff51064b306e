package fingerprint

import (
	"math"
	"strconv"
)

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// number scans the number at s.pos. Every mode rejects a number beyond the
// range of a double, so Sum and Canonicalize accept the same bodies.
func (s *state) number(emit bool) error {
	data := s.data
	start := s.pos
	i := start
	neg := data[i] == '-'
	if neg {
		i++
	}
	intStart := i
	switch {
	case i < len(data) && data[i] == '0':
		i++
	case i < len(data) && isDigit(data[i]):
		for i < len(data) && isDigit(data[i]) {
			i++
		}
	default:
		s.pos = i
		return s.errorf("want a digit in a number")
	}
	intEnd := i
	fracStart, fracEnd := i, i
	if i < len(data) && data[i] == '.' {
		i++
		fracStart = i
		for i < len(data) && isDigit(data[i]) {
			i++
		}
		if i == fracStart {
			s.pos = i
			return s.errorf("want a digit after the decimal point")
		}
		fracEnd = i
	}
	expNeg, hasExp := false, false
	expStart, expEnd := i, i
	if i < len(data) && data[i]|0x20 == 'e' {
		hasExp = true
		i++
		if i < len(data) && (data[i] == '+' || data[i] == '-') {
			expNeg = data[i] == '-'
			i++
		}
		expStart = i
		for i < len(data) && isDigit(data[i]) {
			i++
		}
		if i == expStart {
			s.pos = i
			return s.errorf("want a digit in the exponent")
		}
		expEnd = i
	}
	s.pos = i

	// The value is 0.d₁d₂…dₙ × 10^(lead+exp) with d₁ ≠ 0, where the digits
	// are those of intPart and fracPart without leading and trailing zeros.
	intPart, fracPart := data[intStart:intEnd], data[fracStart:fracEnd]
	var lead int
	if intPart[0] != '0' {
		lead = len(intPart)
	} else {
		k := 0
		for k < len(fracPart) && fracPart[k] == '0' {
			k++
		}
		if k == len(fracPart) {
			if emit {
				s.out = append(s.out, '0') // every spelling of zero, -0 included
			}
			return nil
		}
		lead = -k
		fracPart = fracPart[k:]
		intPart = nil
	}
	exp, huge := parseExponent(data[expStart:expEnd], expNeg)
	if huge && !expNeg {
		s.pos = start
		return s.errorf("number out of the range of a double")
	}
	sci := lead + exp - 1 // exponent of the first significant digit
	if !huge && sci >= 308 {
		if sci > 308 || !fitsDouble(data[start:i]) {
			s.pos = start
			return s.errorf("number out of the range of a double")
		}
	}
	if !emit {
		return nil
	}
	if s.mode == numbersExact {
		s.out = appendExact(s.out, neg, intPart, fracPart, sci, huge, data[expStart:expEnd])
		return nil
	}
	if huge { // a nonzero digit times 10^-(more than 10^15): rounds to 0
		s.out = append(s.out, '0')
		return nil
	}
	if fracStart == fracEnd && !hasExp && len(intPart) <= 15 {
		// An integer of up to 15 digits is a double exactly, and ES6 writes
		// it as it is.
		s.out = append(s.out, data[start:i]...)
		return nil
	}
	f, err := strconv.ParseFloat(string(data[start:i]), 64)
	if err != nil {
		s.pos = start
		return s.errorf("number out of the range of a double")
	}
	s.out = appendES6(s.out, f)
	return nil
}

// parseExponent returns the exponent written in digits, or huge when it is
// beyond ±10^15 (far outside any double, yet valid JSON).
func parseExponent(digits []byte, neg bool) (exp int, huge bool) {
	for len(digits) > 0 && digits[0] == '0' {
		digits = digits[1:]
	}
	if len(digits) > 15 {
		return 0, true
	}
	for _, c := range digits {
		exp = exp*10 + int(c-'0')
	}
	if neg {
		exp = -exp
	}
	return exp, false
}

func fitsDouble(lit []byte) bool {
	_, err := strconv.ParseFloat(string(lit), 64)
	return err == nil
}

// appendExact writes a nonzero number exactly, as d₁.d₂…dₙe<sci> with no
// leading or trailing zero digit: 1, 1.0, 1e0 and 10e-1 all become "1e0",
// and different decimal values always differ. When huge is set, the
// exponent is too large for an int: sci then holds only the part that
// comes from the digits (lead - 1), and the exponent written is
// sci - expDigits, computed digit by digit in time linear in the digits.
func appendExact(b []byte, neg bool, intPart, fracPart []byte, sci int, huge bool, expDigits []byte) []byte {
	if neg {
		b = append(b, '-')
	}
	mark := len(b)
	if len(intPart) > 0 {
		b = append(b, intPart[0], '.')
		b = append(b, intPart[1:]...)
		b = append(b, fracPart...)
	} else {
		b = append(b, fracPart[0], '.')
		b = append(b, fracPart[1:]...)
	}
	for b[len(b)-1] == '0' {
		b = b[:len(b)-1]
	}
	if len(b) == mark+2 { // a single digit: drop the point
		b = b[:len(b)-1]
	}
	b = append(b, 'e')
	if !huge {
		return strconv.AppendInt(b, int64(sci), 10)
	}
	// Only a negative exponent can be huge here: the exponent is
	// sci - E = -(E - sci), where E has more than 15 digits and |sci| is
	// at most the length of the body, so E - sci > 0.
	b = append(b, '-')
	return appendDecimalSub(b, expDigits, sci)
}

// appendDecimalSub appends the decimal digits of E - d, where E is written
// in digits (leading zeros allowed) and E - d > 0. It costs time linear in
// len(digits), where big.Int's conversions would be superlinear.
func appendDecimalSub(b, digits []byte, d int) []byte {
	for len(digits) > 1 && digits[0] == '0' {
		digits = digits[1:]
	}
	start := len(b)
	b = append(b, digits...)
	if d < 0 { // E + |d|: add with carry
		carry := -int64(d)
		for i := len(b) - 1; carry > 0 && i >= start; i-- {
			v := int64(b[i]-'0') + carry%10
			carry /= 10
			if v >= 10 {
				v -= 10
				carry++
			}
			b[i] = byte(v) + '0'
		}
		if carry > 0 {
			var tmp [20]byte
			pre := strconv.AppendInt(tmp[:0], carry, 10)
			b = append(b, pre...) // grow, then shift the digits right
			copy(b[start+len(pre):], b[start:len(b)-len(pre)])
			copy(b[start:], pre)
		}
		return b
	}
	borrow := int64(d) // E - d: subtract with borrow
	for i := len(b) - 1; borrow > 0 && i >= start; i-- {
		v := int64(b[i]-'0') - borrow%10
		borrow /= 10
		if v < 0 {
			v += 10
			borrow++
		}
		b[i] = byte(v) + '0'
	}
	z := start
	for z < len(b)-1 && b[z] == '0' {
		z++
	}
	n := copy(b[start:], b[z:])
	return b[:start+n]
}

// appendES6 writes f as ECMAScript's Number::toString does, which is what
// RFC 8785 requires: the shortest digits that read back as f, in plain
// notation from 1e-6 up to 1e21 and in exponent notation outside.
func appendES6(b []byte, f float64) []byte {
	if f == 0 {
		return append(b, '0') // -0 too
	}
	if abs := math.Abs(f); abs >= 1e-6 && abs < 1e21 {
		return strconv.AppendFloat(b, f, 'f', -1, 64)
	}
	b = strconv.AppendFloat(b, f, 'e', -1, 64)
	// strconv writes at least two exponent digits ("1e-07"); ES6 writes no
	// leading zero ("1e-7").
	if n := len(b); b[n-2] == '0' && (b[n-3] == '-' || b[n-3] == '+') {
		b[n-2] = b[n-1]
		b = b[:n-1]
	}
	return b
}
