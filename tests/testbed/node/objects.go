package main

// Reading the Secrets and ConfigMaps that pods refer to, for env and volumes alike: from the
// API server when a pod starts, and from the agent's informer caches when volumes are
// refreshed (see volumes.go), whose changes also trigger a refresh.

import (
	"context"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1informers "k8s.io/client-go/informers/core/v1"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
)

// objectKind is a kind whose data a pod can use: "Secret" or "ConfigMap".
type objectKind string

const (
	secretKind    objectKind = "Secret"
	configMapKind objectKind = "ConfigMap"
)

// objectData is a Secret's or a ConfigMap's data (a ConfigMap's data and binaryData together).
// A missing object is nil data and no error when optional, an error otherwise.
func (p *provider) objectData(ctx context.Context, kind objectKind, namespace, name string, optional bool) (map[string][]byte, error) {
	data, err := p.readObjectData(ctx, kind, namespace, name)
	if apierrors.IsNotFound(err) && optional {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s/%s: %w", kind, namespace, name, err)
	}
	return data, nil
}

func (p *provider) readObjectData(ctx context.Context, kind objectKind, namespace, name string) (map[string][]byte, error) {
	if kind == secretKind {
		secret, err := p.client.CoreV1().Secrets(namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return secret.Data, nil
	}
	configMap, err := p.client.CoreV1().ConfigMaps(namespace).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return nil, err
	}
	return configMapData(configMap), nil
}

func configMapData(configMap *corev1.ConfigMap) map[string][]byte {
	data := map[string][]byte{}
	for key, value := range configMap.Data {
		data[key] = []byte(value)
	}
	for key, value := range configMap.BinaryData {
		data[key] = value
	}
	return data
}

// objectReader reads a Secret's or ConfigMap's data as objectData does.
type objectReader func(ctx context.Context, kind objectKind, namespace, name string, optional bool) (map[string][]byte, error)

// objectCache is the agent's Secret and ConfigMap informers (nil in unit tests: then reads go
// to the API server).
type objectCache struct {
	secrets    corev1listers.SecretLister
	configMaps corev1listers.ConfigMapLister
	synced     func() bool
}

// watchObjects reads Secrets and ConfigMaps from these informers for volume refreshes, and
// asks the pods of an object's namespace to refresh their volumes when it changes.
func (p *provider) watchObjects(secrets corev1informers.SecretInformer, configMaps corev1informers.ConfigMapInformer) {
	secretInformer, configMapInformer := secrets.Informer(), configMaps.Informer()
	p.objects = &objectCache{
		secrets:    secrets.Lister(),
		configMaps: configMaps.Lister(),
		synced:     func() bool { return secretInformer.HasSynced() && configMapInformer.HasSynced() },
	}
	kick := func(obj any) {
		key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
		if err != nil {
			return
		}
		namespace, _, _ := strings.Cut(key, "/")
		p.kickVolumes(namespace)
	}
	handler := cache.ResourceEventHandlerFuncs{
		AddFunc:    kick,
		UpdateFunc: func(_, obj any) { kick(obj) },
		DeleteFunc: kick,
	}
	_, _ = secretInformer.AddEventHandler(handler)
	_, _ = configMapInformer.AddEventHandler(handler)
}

// kickVolumes asks every pod of the namespace for a volume refresh now.
func (p *provider) kickVolumes(namespace string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for key, runtime := range p.pods {
		if strings.HasPrefix(key, namespace+"/") {
			runtime.kickVolumes()
		}
	}
}

// cachedObjectData is objectData from the informer caches (from the API server without them).
func (p *provider) cachedObjectData(ctx context.Context, kind objectKind, namespace, name string, optional bool) (map[string][]byte, error) {
	if p.objects == nil {
		return p.objectData(ctx, kind, namespace, name, optional)
	}
	if !p.objects.synced() {
		return nil, fmt.Errorf("%s %s/%s: the informer cache is not synced yet", kind, namespace, name)
	}
	var data map[string][]byte
	var err error
	if kind == secretKind {
		var secret *corev1.Secret
		if secret, err = p.objects.secrets.Secrets(namespace).Get(name); err == nil {
			data = secret.Data
		}
	} else {
		var configMap *corev1.ConfigMap
		if configMap, err = p.objects.configMaps.ConfigMaps(namespace).Get(name); err == nil {
			data = configMapData(configMap)
		}
	}
	if apierrors.IsNotFound(err) && optional {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s %s/%s: %w", kind, namespace, name, err)
	}
	return data, nil
}

// keyValue is one key of a Secret or ConfigMap; found is false for an optional key or object
// that is missing.
func (p *provider) keyValue(ctx context.Context, kind objectKind, namespace, name, key string, optional bool) (string, bool, error) {
	data, err := p.objectData(ctx, kind, namespace, name, optional)
	if err != nil {
		return "", false, err
	}
	value, ok := data[key]
	switch {
	case ok:
		return string(value), true, nil
	case optional:
		return "", false, nil
	}
	return "", false, fmt.Errorf("couldn't find key %s in %s %s/%s", key, kind, namespace, name)
}
