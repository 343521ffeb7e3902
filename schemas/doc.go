// Package schemas is dlxbridge's schema registry and validation gate.
//
// The registry is one JSON Schema file per message type and version,
// <type>/v<N>.json, embedded in the binary and optionally overlaid by a
// directory (LoadOptions.Dir) so teams can add versions without a rebuild.
// Every file is compiled once by Load (draft 2020-12 unless it says
// otherwise, formats such as uuid, date-time and email asserted) and is a
// resource at URL(type, version), so files $ref each other relatively, e.g.
// "../common/v1.json#/$defs/money". Nothing is ever fetched from the network.
// A file whose root only holds "$defs" (and annotations), like
// common/v1.json, is shared definitions (Ref.Kind KindDefinitions), not a
// message type.
//
// The Gate runs before any handler: it checks the body size and content type,
// finds the message's type and version (see Identity), decodes the body once
// (rejecting invalid UTF-8, duplicate keys, deep nesting and absurd numbers,
// which encoding/json lets through), and validates it. Every failure is a
// *ValidationError with a Reason: a schema failure is never retried, it goes
// straight to quarantine with its violations.
//
// Load also compiles each schema for a fast path that only answers "valid"
// or "not": types, properties, required, additionalProperties,
// patternProperties, propertyNames, min/maxProperties, dependent*, items,
// prefixItems, contains, min/maxItems, uniqueItems, min/maxLength, pattern,
// format, the numeric bounds, multipleOf, enum, const, $ref, allOf, anyOf,
// oneOf, not and if/then/else. A message it calls valid passes; any other is
// validated by jsonschema, whose verdict and violations the gate reports, so
// the gate's verdicts and messages are jsonschema's (on an invalid message,
// jsonschema runs only on the subschemas and values the fast path finds
// failing, with the violations a whole validation gives). A schema that uses
// anything else (unevaluated*, $dynamicRef, asserted content*, extensions)
// is validated by jsonschema alone.
//
// Bound every array with maxItems (and open-ended objects with
// maxProperties): the validator checks each element of an array and builds an
// error for each one that fails, about 1 KB apiece. On bodies over 32 KiB the
// gate enforces those two limits before validating, so an oversized array
// costs nothing; an unbounded array of half a million bad elements still
// costs about 500 MB of garbage within the 1 MiB default body limit.
//
// The package is a leaf: it imports nothing of dlxbridge and no AMQP client.
package schemas
