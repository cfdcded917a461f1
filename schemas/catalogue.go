package schemas

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"sort"
	"sync"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// Sentinel errors of the catalogue.
var (
	// ErrUnknownType: the event type is not in the catalogue.
	ErrUnknownType = errors.New("unknown event type")
	// ErrInvalidData: the event data does not satisfy its JSON Schema.
	ErrInvalidData = errors.New("event data fails its schema")
)

// SchemaVersion is the version of every data schema in this catalogue.
const SchemaVersion = "v1"

//go:embed v1/*.json
var schemaFiles embed.FS

// entry ties an event type to its Go data type.
type entry struct {
	newData func() any
	// name and dataSchema are the type's name and DataSchemaURI, made
	// once (NewCatalogue) for readers that look types up by their bytes.
	name, dataSchema string
}

func catalogueEntries() map[string]entry {
	return map[string]entry{
		TypeSessionStarted:     {newData: func() any { return new(SessionStarted) }},
		TypeSessionCompleted:   {newData: func() any { return new(SessionCompleted) }},
		TypeSessionFailed:      {newData: func() any { return new(SessionFailed) }},
		TypeJobRequested:       {newData: func() any { return new(JobRequested) }},
		TypeJobStarted:         {newData: func() any { return new(JobStarted) }},
		TypeJobHeartbeat:       {newData: func() any { return new(JobHeartbeat) }},
		TypeJobReleased:        {newData: func() any { return new(JobReleased) }},
		TypeJobCompleted:       {newData: func() any { return new(JobCompleted) }},
		TypeJobFailed:          {newData: func() any { return new(JobFailed) }},
		TypeToolStarted:        {newData: func() any { return new(ToolStarted) }},
		TypeToolCompleted:      {newData: func() any { return new(ToolCompleted) }},
		TypeAgentMessage:       {newData: func() any { return new(AgentMessage) }},
		TypeArtifactStored:     {newData: func() any { return new(ArtifactStored) }},
		TypeValidationPassed:   {newData: func() any { return new(Verdict) }},
		TypeValidationFailed:   {newData: func() any { return new(Verdict) }},
		TypeStepCompleted:      {newData: func() any { return new(StepCompleted) }},
		TypeStepFailed:         {newData: func() any { return new(StepFailed) }},
		TypeSignalStop:         {newData: func() any { return new(Signal) }},
		TypeSignalPause:        {newData: func() any { return new(Signal) }},
		TypeSignalResume:       {newData: func() any { return new(Signal) }},
		TypeSignalInfo:         {newData: func() any { return new(Signal) }},
		TypeSignalInvalidate:   {newData: func() any { return new(Signal) }},
		TypeSignalAcknowledged: {newData: func() any { return new(SignalAcknowledged) }},
		TypeJobCancelled:       {newData: func() any { return new(JobCancelled) }},
		TypeStepWaiting:        {newData: func() any { return new(StepWaiting) }},
		TypeStepPaused:         {newData: func() any { return new(StepPaused) }},
		TypeStepResumed:        {newData: func() any { return new(StepResumed) }},
		TypeStepInvalidated:    {newData: func() any { return new(StepInvalidated) }},
		TypeSessionPaused:      {newData: func() any { return new(SessionPaused) }},
		TypeSessionStopped:     {newData: func() any { return new(SessionStopped) }},
		TypeSessionResumed:     {newData: func() any { return new(SessionResumed) }},
		TypeTaskAdded:          {newData: func() any { return new(TaskAdded) }},
		TypeTaskUpdated:        {newData: func() any { return new(TaskUpdated) }},
		TypeTaskSelected:       {newData: func() any { return new(TaskSelected) }},
		TypeBacklogPhase:       {newData: func() any { return new(BacklogPhase) }},
		TypeHookCompleted:      {newData: func() any { return new(HookRun) }},
		TypeHookFailed:         {newData: func() any { return new(HookRun) }},
		TypeLoopSpawned:        {newData: func() any { return new(LoopSpawned) }},
		TypeLoopMerged:         {newData: func() any { return new(LoopMerged) }},
		TypeLoopRebase:         {newData: func() any { return new(LoopRebase) }},
		TypeLoopInvalidated:    {newData: func() any { return new(LoopInvalidated) }},

		// No session left hanging.
		TypeSessionBudget: {newData: func() any { return new(SessionBudget) }},
		TypeSessionClosed: {newData: func() any { return new(SessionClosed) }},
		TypeSessionRerun:  {newData: func() any { return new(SessionRerun) }},
		TypeSessionForked: {newData: func() any { return new(SessionForked) }},

		// Sessions imported from other systems.
		TypeStepImported: {newData: func() any { return new(StepImported) }},

		// Approval gates.
		TypeSignalApprove:     {newData: func() any { return new(Signal) }},
		TypeSignalReject:      {newData: func() any { return new(Signal) }},
		TypeApprovalRequested: {newData: func() any { return new(ApprovalRequested) }},
		TypeApprovalExpired:   {newData: func() any { return new(ApprovalExpired) }},
	}
}

// DataSchemaURI returns the dataschema attribute for an event type: a URN
// naming the file schemas/v1/<entity>.<verb>.json in this repository.
func DataSchemaURI(typ string) string {
	ev, _ := EntityVerb(typ)
	return "urn:loopbus:schema:" + SchemaVersion + ":" + ev
}

// SchemaFile returns the embedded JSON Schema document of an event type.
func SchemaFile(typ string) ([]byte, error) {
	ev, err := EntityVerb(typ)
	if err != nil {
		return nil, err
	}
	b, err := schemaFiles.ReadFile(SchemaVersion + "/" + ev + ".json")
	if err != nil {
		return nil, fmt.Errorf("%w %q", ErrUnknownType, typ)
	}
	return b, nil
}

// Catalogue validates and decodes event data. It is safe for concurrent
// use. Each type's schema is compiled when first needed, so a process pays
// only for the types it meets (a command-line call a few, a service its
// own), and compiles it for the generic validator only when the fast
// check does not pass a value; CompileAll compiles them all.
type Catalogue struct {
	entries  map[string]entry
	compiled map[string]*compiledSchema
}

// compiledSchema is one type's schema, compiled once for the fast check
// (nil when the schema uses a keyword the fast check lacks) and, only
// when the fast check does not pass a value, once for the generic
// validator.
type compiledSchema struct {
	fastOnce sync.Once
	fast     *fastNode

	once sync.Once
	sch  *jsonschema.Schema
	err  error
}

// NewCatalogue returns the catalogue of the embedded schemas.
func NewCatalogue() (*Catalogue, error) {
	c := &Catalogue{entries: catalogueEntries(), compiled: map[string]*compiledSchema{}}
	for typ, e := range c.entries {
		if _, err := SchemaFile(typ); err != nil {
			return nil, err
		}
		e.name, e.dataSchema = typ, DataSchemaURI(typ)
		c.entries[typ] = e
		c.compiled[typ] = &compiledSchema{}
	}
	return c, nil
}

// CompileAll compiles every type's schema now, returning the first error.
func (c *Catalogue) CompileAll() error {
	for _, typ := range c.Types() {
		if _, err := c.schema(typ); err != nil {
			return err
		}
	}
	return nil
}

// schema returns typ's compiled schema, compiling it on first use.
func (c *Catalogue) schema(typ string) (*jsonschema.Schema, error) {
	cs := c.compiled[typ]
	cs.once.Do(func() { cs.sch, cs.err = compileEventSchema(typ) })
	return cs.sch, cs.err
}

// fast returns typ's schema compiled for the fast check, compiling it on
// first use; nil when the fast check cannot decide for typ.
func (c *Catalogue) fast(typ string) *fastNode {
	cs := c.compiled[typ]
	cs.fastOnce.Do(func() {
		raw, err := SchemaFile(typ)
		if err != nil {
			return
		}
		if doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw)); err == nil {
			cs.fast = compileFast(doc)
		}
	})
	return cs.fast
}

func compileEventSchema(typ string) (*jsonschema.Schema, error) {
	raw, err := SchemaFile(typ)
	if err != nil {
		return nil, err
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return nil, fmt.Errorf("schema of %s: %w", typ, err)
	}
	comp := jsonschema.NewCompiler()
	comp.DefaultDraft(jsonschema.Draft2020)
	comp.UseLoader(noLoader{})
	uri := DataSchemaURI(typ)
	if err := comp.AddResource(uri, doc); err != nil {
		return nil, fmt.Errorf("schema of %s: %w", typ, err)
	}
	sch, err := comp.Compile(uri)
	if err != nil {
		return nil, fmt.Errorf("schema of %s: %w", typ, err)
	}
	return sch, nil
}

// Types lists the catalogue's event types, sorted.
func (c *Catalogue) Types() []string {
	out := make([]string, 0, len(c.entries))
	for t := range c.entries {
		out = append(out, t)
	}
	sort.Strings(out)
	return out
}

// Known reports whether typ is in the catalogue.
func (c *Catalogue) Known(typ string) bool {
	_, ok := c.entries[typ]
	return ok
}

// Lookup returns the catalogue's type whose name is typ, and its
// DataSchemaURI; ok is false for a type not in the catalogue. The strings
// are the catalogue's own, so a reader that holds a type's name as bytes
// (a decoder) gets it without making a string of its own.
func (c *Catalogue) Lookup(typ []byte) (name, dataSchema string, ok bool) {
	e, ok := c.entries[string(typ)]
	return e.name, e.dataSchema, ok
}

// Decode validates raw JSON data against the schema of typ and decodes it
// into the registered Go type. Errors wrap ErrUnknownType or ErrInvalidData.
func (c *Catalogue) Decode(typ string, raw []byte) (any, error) {
	e, ok := c.entries[typ]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownType, typ)
	}
	if err := c.validateRaw(typ, raw); err != nil {
		return nil, err
	}
	// JSON v2 matches member names exactly and refuses duplicate names, so
	// the Go value holds exactly the members the schema checked
	// (encoding/json would let {"JOBID": ""} overwrite a valid "jobId").
	v := e.newData()
	if err := jsonv2.Unmarshal(raw, v); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalidData, typ, err)
	}
	return v, nil
}

// DecodeUnchecked decodes raw JSON data into the Go type registered for
// typ without checking it against the schema: for readers of events
// that were checked where they entered (see bus.ReadOptions.SkipSchema).
// Errors wrap ErrUnknownType or ErrInvalidData (not JSON, or a value of
// the wrong JSON type for its field).
func (c *Catalogue) DecodeUnchecked(typ string, raw []byte) (any, error) {
	e, ok := c.entries[typ]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownType, typ)
	}
	v := e.newData()
	if err := jsonv2.Unmarshal(raw, v); err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalidData, typ, err)
	}
	return v, nil
}

// Encode checks that data has the Go type registered for typ, validates it
// against the schema and returns its JSON.
func (c *Catalogue) Encode(typ string, data any) ([]byte, error) {
	e, ok := c.entries[typ]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownType, typ)
	}
	if want := e.newData(); reflect.TypeOf(want) != reflect.TypeOf(data) {
		return nil, fmt.Errorf("%w: %s wants data of type %T, got %T", ErrInvalidData, typ, want, data)
	}
	raw, err := json.Marshal(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrInvalidData, typ, err)
	}
	if err := c.validateRaw(typ, raw); err != nil {
		return nil, err
	}
	return raw, nil
}

// validateRaw checks raw against typ's schema. The fast check decides
// the valid data it can; the generic validator decides the rest and says
// what is wrong.
func (c *Catalogue) validateRaw(typ string, raw []byte) error {
	if fast := c.fast(typ); fast != nil && fastCheck(fast, raw) == pass {
		return nil
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("%w: %s: data is not JSON: %v", ErrInvalidData, typ, err)
	}
	sch, err := c.schema(typ)
	if err != nil {
		return err
	}
	if err := sch.Validate(inst); err != nil {
		return fmt.Errorf("%w: %s: %s", ErrInvalidData, typ, summarize(err))
	}
	return nil
}

// summarize flattens a jsonschema error into "pointer: message" items.
func summarize(err error) string {
	var ve *jsonschema.ValidationError
	if !errors.As(err, &ve) {
		return err.Error()
	}
	var b bytes.Buffer
	for i, le := range leafErrors(ve) {
		if i > 0 {
			b.WriteString("; ")
		}
		fmt.Fprintf(&b, "%s: %s", DisplayPointer(le.Pointer), le.Message)
	}
	return b.String()
}
