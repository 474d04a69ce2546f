// SPDX-License-Identifier: Apache-2.0

package serve

import (
	"fmt"
	"reflect"
	"slices"
	"testing"

	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/session"
	"github.com/nvfeed/nvfeed/cmd/loaderd/internal/wire"
)

// fill sets every field of the value v points to to a value other than
// its zero, different for each field (n counts them).
func fill(v reflect.Value, n *int) {
	*n++
	switch v.Kind() {
	case reflect.Struct:
		for i := range v.NumField() {
			if v.Type().Field(i).IsExported() {
				fill(v.Field(i), n)
			}
		}
	case reflect.Pointer:
		v.Set(reflect.New(v.Type().Elem()))
		fill(v.Elem(), n)
	case reflect.Slice:
		v.Set(reflect.MakeSlice(v.Type(), 2, 2))
		fill(v.Index(0), n)
		fill(v.Index(1), n)
	case reflect.Map:
		v.Set(reflect.MakeMap(v.Type()))
		v.SetMapIndex(reflect.ValueOf("k").Convert(v.Type().Key()), reflect.ValueOf(*n).Convert(v.Type().Elem()))
	case reflect.String:
		v.SetString("s" + string(rune('a'+*n%26)))
	case reflect.Bool:
		v.SetBool(true)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		v.SetInt(int64(*n))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		v.SetUint(uint64(*n))
	case reflect.Interface:
		v.Set(reflect.ValueOf(*n))
	}
}

// TestConvertCarriesEveryField: each conversion between a wire message
// and its session type carries every field, and the two types have the
// same fields (names and types) but for the wire's own (stream-only
// frames' fields): a field added on one side only fails here, not in a
// client.
func TestConvertCarriesEveryField(t *testing.T) {
	tests := []struct {
		name     string
		from     any                // a pointer to the type converted from
		convert  func(from any) any // the conversion, under test
		wireOnly []string           // fields of the wire type the session type lacks
		// sessionOnly are the session type's fields that decide what is
		// sent but are not sent themselves.
		sessionOnly []string
	}{
		{name: "OpenRequest to OpenParams", from: &wire.OpenRequest{},
			convert: func(f any) any { return openParams(*f.(*wire.OpenRequest)) }},
		{name: "Opened to OpenResponse", from: &session.Opened{},
			convert: func(f any) any { return openResponse(*f.(*session.Opened)) }},
		{name: "Delivery to NextResponse", from: &session.Delivery{}, wireOnly: []string{"Error", "ErrorStatus", "ErrorCode", "Stopped"},
			convert: func(f any) any { return nextResponse(*f.(*session.Delivery)) }},
		// StaleExtents reaches the wire as the status's stale_causes.
		{name: "DatasetInfo", from: &session.DatasetInfo{}, sessionOnly: []string{"Listable", "StaleExtents"},
			convert: func(f any) any { return datasetsResponse([]session.DatasetInfo{*f.(*session.DatasetInfo)}).Datasets[0] }},
		{name: "Reloaded", from: &session.Reloaded{},
			convert: func(f any) any { return reloadResponse([]session.Reloaded{*f.(*session.Reloaded)}).Datasets[0] }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := 0
			fill(reflect.ValueOf(tt.from).Elem(), &n)
			from := reflect.ValueOf(tt.from).Elem()
			to := reflect.ValueOf(tt.convert(tt.from))
			sessionSide, wireSide := from, to
			if _, ok := tt.from.(*wire.OpenRequest); ok {
				sessionSide, wireSide = to, from
			}
			for f := range wireSide.Type().Fields() {
				sf, ok := sessionSide.Type().FieldByName(f.Name)
				switch {
				case slices.Contains(tt.wireOnly, f.Name):
					if ok {
						t.Errorf("%s.%s is listed as the wire's own, but %s has it", wireSide.Type(), f.Name, sessionSide.Type())
					}
				case !ok:
					t.Errorf("%s.%s has no field in %s", wireSide.Type(), f.Name, sessionSide.Type())
				case sf.Type != f.Type && !(f.Type.Kind() == reflect.Pointer && f.Type.Elem() == sf.Type) && !sameShape(sf.Type, f.Type):
					t.Errorf("%s.%s is %s, %s's is %s", wireSide.Type(), f.Name, f.Type, sessionSide.Type(), sf.Type)
				case !reflect.DeepEqual(carried(from.FieldByName(f.Name)), carried(to.FieldByName(f.Name))) &&
					!(sameShape(sf.Type, f.Type) && fmt.Sprint(carried(from.FieldByName(f.Name))) == fmt.Sprint(carried(to.FieldByName(f.Name)))):
					t.Errorf("%s: field %s not carried: %v became %v", tt.name, f.Name, carried(from.FieldByName(f.Name)), carried(to.FieldByName(f.Name)))
				}
			}
			for f := range sessionSide.Type().Fields() {
				if _, ok := wireSide.Type().FieldByName(f.Name); !ok && !slices.Contains(tt.sessionOnly, f.Name) {
					t.Errorf("%s.%s has no field in %s: it never reaches the wire", sessionSide.Type(), f.Name, wireSide.Type())
				}
			}
		})
	}
}

// sameShape says whether a and b are slices of structs with the same
// fields, names and types (a session list and its wire twin).
func sameShape(a, b reflect.Type) bool {
	if a.Kind() != reflect.Slice || b.Kind() != reflect.Slice || a.Elem().Kind() != reflect.Struct || b.Elem().Kind() != reflect.Struct {
		return false
	}
	ea, eb := a.Elem(), b.Elem()
	if ea.NumField() != eb.NumField() {
		return false
	}
	for i := range ea.NumField() {
		if ea.Field(i).Name != eb.Field(i).Name || ea.Field(i).Type != eb.Field(i).Type {
			return false
		}
	}
	return true
}

// carried is a field's value as it travels: a wire field that is a
// pointer (a count given only to some callers, omitted otherwise) carries
// what it points to.
func carried(v reflect.Value) any {
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return nil
		}
		return v.Elem().Interface()
	}
	return v.Interface()
}
